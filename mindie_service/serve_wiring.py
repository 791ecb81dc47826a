"""The CLI's wiring of `mindie-service serve`: what the server gets from the devkit, plugged in from here so
that ``mindie_service.server`` never imports ``mindie_service.devkit``.

- ``--prepare``: the packaged model the config names and development certificates, each only where nothing
  exists yet (never a demo model, never into a folder that exists).
- mock models (``ModelConfig[].mock``): the devkit's ``MockEngine``; every other model the real engine.
- the testing fault hook (``MINDIE_SERVICE_FAULTS``), a no-op when the variable is not set.
- the ready banner: a curl line that works against the development certificates."""
from __future__ import annotations

import ipaddress
import logging
import os
import time
import shlex
from pathlib import Path

from mindie_service.config import ServiceConfig
from mindie_service.engine.client import EngineClient
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.errors import ConfigError
from mindie_service.models.packaged_models import PACKAGED_MODELS, place_packaged
from mindie_service.server.auth import read_key_file
from mindie_service.server.main import ServeWiring, build_model_engine

logger = logging.getLogger(__name__)

# What the ready banner asks: a real instruct model answers both with Paris.
MINDIE_BODY = '{"inputs": "The capital of France is", "parameters": {"max_new_tokens": 8}}'
CHAT_BODY = ('{"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 30, '
             '"temperature": 0}')


def _dev_cert_dir(cfg: ServiceConfig) -> Path | None:
    """The folder generate_dev_certs writes to, when the config's TLS paths follow its layout."""
    tls = cfg.server.tls
    out = Path(tls.cert).parent.parent
    expected = {Path(tls.cert): out / "certs/server.pem", Path(tls.pk): out / "keys/server.key.pem"}
    if tls.ca_files:
        expected[Path(tls.ca_files[0])] = out / "ca/ca.pem"
    return out if all(k == v for k, v in expected.items()) else None


def prepare_assets(cfg: ServiceConfig) -> None:
    """What ``serve --prepare`` (``make serve``) may create, and only where nothing exists yet: a packaged model
    (models.packaged_models) into the missing folder a ModelConfig names after it, and development certificates
    where the TLS keys follow gen-certs' layout and none is there. Nothing else is built or written: a missing or
    odd modelWeightPath is check_files' error naming the key, and a path that exists is never touched."""
    for m in cfg.models:
        folder = Path(m.weight_path)
        if m.mock or folder.name not in PACKAGED_MODELS:
            continue
        if os.path.lexists(folder):
            logger.info("%s exists; not placing the packaged model %s there", folder, folder.name)
            continue
        place_packaged(folder.name, folder)
    if cfg.server.https_enabled:
        out = _dev_cert_dir(cfg)
        if out is None:
            logger.warning("TLS paths do not follow the gen-certs layout; not generating certificates")
        else:
            from mindie_service.devkit.certs import generate_dev_certs

            generate_dev_certs(str(out), if_missing=True)


def _tls_args(cfg: ServiceConfig) -> list[str]:
    """curl's TLS options for the business port: the CA that signed the server's certificate (the dev CA of
    gen-certs when the config follows its layout, else MindIE's one CA of ``tlsCaFile``, else a placeholder),
    and a client certificate only when the server asks for one (a non-empty ``tlsCaFile``)."""
    tls = cfg.server.tls
    out = _dev_cert_dir(cfg)
    dev_ca = out / "ca/ca.pem" if out is not None else None
    if dev_ca is not None and dev_ca.is_file():
        args = ["--cacert", str(dev_ca)]
    else:
        args = ["--cacert", tls.ca_files[0] if tls.ca_files else "SERVER_CA.pem"]
    if not tls.ca_files:  # server-only TLS: no client certificate is asked
        return args
    client = out / "certs/client.pem" if out is not None else None
    if client is not None and client.is_file():
        return args + ["--cert", str(client), "--key", str(out / "keys/client.key.pem")]  # type: ignore[operator]
    return args + ["--cert", "CLIENT_CERT.pem", "--key", "CLIENT_KEY.pem"]


def _asks_business_key(cfg: ServiceConfig) -> bool:
    """The business port asks for a key: businessApiKeys, or a business line in apiKeyFile."""
    s = cfg.server
    pairs = list(s.api_key_hashes)
    if s.api_key_file is not None:
        try:
            pairs += read_key_file(s.api_key_file)
        except ConfigError:
            return True  # the server refused to start on it already; say a key may be needed
    return any(plane == "business" for plane, _ in pairs)


def _base_url(cfg: ServiceConfig) -> str:
    s = cfg.server
    host = s.ip_address
    ip = ipaddress.ip_address(host)
    if ip.is_unspecified:
        host = "127.0.0.1" if ip.version == 4 else "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if s.https_enabled else 'http'}://{host}:{s.port}"


def curl_line(cfg: ServiceConfig, path: str = "/", body: str = MINDIE_BODY, note: bool = True) -> str:
    """A curl command for ``path`` (default MindIE's `/`) of the running server, right for its TLS setting
    (plain HTTP, server-only TLS, mutual TLS with the dev client certificate) and, when the business port
    asks for API keys, with the Authorization header to fill in."""
    parts = ["curl", *(_tls_args(cfg) if cfg.server.https_enabled else [])]
    parts += ["-H", "Content-Type: application/json", "-d", body, _base_url(cfg) + path]
    line = " ".join(shlex.quote(p) for p in parts)
    if _asks_business_key(cfg):  # the keys are kept hashed: the user sets the variable to one of theirs
        line += ' -H "Authorization: Bearer $MINDIE_API_KEY"'
        if note:
            line += ("\n\n  (the business port asks for an API key: "
                     "export MINDIE_API_KEY=<one of ServerConfig.businessApiKeys or apiKeyFile's keys>)")
    return line


def ready_banner(cfg: ServiceConfig) -> str:
    """Two lines to paste: MindIE's `/` (plain completion) and OpenAI's chat route (the chat template)."""
    return curl_line(cfg, note=False) + "\n\n  " + curl_line(cfg, "/v1/chat/completions", CHAT_BODY)


def model_engine(ec: EngineConfig, mock: bool) -> EngineClient:
    """The engine of one model (runs in a worker thread): the devkit's mock for a mock model."""
    from mindie_service.devkit.faults import load_delay

    time.sleep(load_delay(os.environ))  # the testing hook's slow_load (0 unless MINDIE_SERVICE_FAULTS says)
    if mock:
        from mindie_service.devkit.mock_engine import MockEngine

        return MockEngine(ec)
    return build_model_engine(ec, False)


def with_test_faults(engine: EngineClient) -> EngineClient:
    """A testing hook: faults injected into the engine only with MINDIE_SERVICE_FAULTS set."""
    from mindie_service.devkit.faults import install_from_env

    return install_from_env(engine, os.environ)


def cli_wiring(prepare: bool) -> ServeWiring:
    """What `mindie-service serve [--prepare]` plugs into the server."""
    return ServeWiring(prepare=prepare_assets if prepare else None, model_engine=model_engine,
                       wrap_engine=with_test_faults, ready_banner=ready_banner if prepare else None)
