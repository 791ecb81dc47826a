"""deploy/: the Kubernetes manifests load (PyYAML) and carry what the references require: probes on a port that
needs no client certificate, a draining preStop inside the grace period, TLS from a Secret, an InferencePool
(inference.networking.k8s.io/v1) selecting the pods on their business port, InferenceObjectives naming it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from mindie_service.cli import _parser
from mindie_service.config import load_config
from mindie_service.vllm_cli import config_overrides

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DRAIN_S, CLOSE_S = 60, 5  # server/main.py: DRAIN_TIMEOUT_S, the connection close wait
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _docs(name: str) -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]
    for d in docs:
        assert {"apiVersion", "kind", "metadata"} <= d.keys() and NAME.match(d["metadata"]["name"]), d
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


@pytest.fixture(scope="module")
def app():
    return _docs("mindie-service.yaml")


@pytest.fixture(scope="module")
def gateway():
    return _docs("inference-gateway.yaml")


@pytest.fixture(scope="module")
def service_config(app, tmp_path_factory):
    path = tmp_path_factory.mktemp("deploy") / "config.json"
    path.write_text(app["ConfigMap/mindie-service-config"]["data"]["config.json"])
    # the Deployment's command, vLLM's flags included, over the ConfigMap's file
    command = _container(app)[1]["command"]
    assert command[:2] == ["mindie-service", "serve"]
    argv = [str(path) if a == "/etc/mindie/config/config.json" else a for a in command[1:]]
    args, extra = _parser().parse_known_args(argv)
    assert extra == [] and args.config == str(path)
    return load_config(path, env={"MIES_CONTAINER_IP": "10.1.2.3", "MIES_CONTAINER_MANAGEMENT_IP": "10.1.2.3"},
                       overrides=config_overrides(args))


def test_the_command_line_is_vllms_and_sets_the_model(service_config):
    m, e = service_config.models[0], service_config.engine_config()
    assert (m.name, m.weight_path) == ("qwen2-7b-instruct", "/models/qwen2-7b-instruct")
    assert (e.max_seq_len, e.max_batch_size, e.enable_prefix_caching, e.max_loras) == (4096, 64, True, 4)
    assert service_config.server.metrics_port == service_config.server.port == 1025


def _container(app):
    dep = app["Deployment/mindie-service"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return dep, c


def _port(c, ref) -> int:
    return ref if isinstance(ref, int) else next(p["containerPort"] for p in c["ports"] if p["name"] == ref)


def test_deployment_probes_use_the_plain_probe_port(app, service_config):
    dep, c = _container(app)
    assert dep["apiVersion"] == "apps/v1" and dep["spec"]["replicas"] == 1
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    srv = service_config.server
    assert srv.probe_port is not None and srv.ip_address == "10.1.2.3"
    for probe, path in (("livenessProbe", "/v2/health/live"), ("readinessProbe", "/v2/health/ready"),
                        ("startupProbe", "/v2/health/live")):
        get = c[probe]["httpGet"]
        assert get["path"] == path and get["scheme"] == "HTTP" and _port(c, get["port"]) == srv.probe_port
    # the probe port is a listener of its own, serving the probe plane only (no TLS there)
    assert service_config.server.listeners()[("10.1.2.3", srv.probe_port)] == ("probe",)
    assert _port(c, "management") == srv.management_port and _port(c, "http") == srv.port == srv.metrics_port


def test_prestop_drains_within_the_grace_period(app, service_config):
    dep, c = _container(app)
    cmd = " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
    assert "/stopService" in cmd and f":{service_config.server.management_port}/" in cmd
    pre_sleep = int(re.search(r"sleep (\d+);", cmd).group(1))
    drain = pre_sleep + min(DRAIN_S, service_config.server.e2e_timeout) + CLOSE_S
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain


def test_tls_comes_from_a_secret_holding_every_file_the_config_names(app, service_config):
    dep, c = _container(app)
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    secret = volumes[mounts["/etc/mindie/tls"]]["secret"]
    files = {"/etc/mindie/tls/" + i["path"] for i in secret["items"]}
    srv = service_config.server
    assert service_config.server.https_enabled
    needed = {srv.tls.cert, srv.tls.pk, *srv.management_tls.ca_files}
    assert needed <= files and srv.management_tls.ca_files and not srv.tls.ca_files  # mTLS on management only
    assert {"/etc/mindie/tls/client.pem", "/etc/mindie/tls/client.key.pem"} <= files  # the preStop's client
    assert mounts["/etc/mindie/config"] == "config" and volumes["config"]["configMap"]["name"] == \
        "mindie-service-config"
    svc = app["Service/mindie-service"]
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    names = {p["name"] for p in c["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= names
    assert service_config.backend.kv_events is not None and _port(c, "kv-events") == 5557


def test_inference_pool_selects_the_pods_on_their_business_port(app, gateway, service_config):
    dep, _ = _container(app)
    pool = gateway["InferencePool/mindie-pool"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    spec = pool["spec"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert 1 <= len(spec["selector"]["matchLabels"]) <= 64 and spec["selector"]["matchLabels"].items() <= labels.items()
    assert len(spec["targetPorts"]) == 1 and spec["targetPorts"][0]["number"] == service_config.server.port
    ref = spec["endpointPickerRef"]
    assert ref["name"] and 1 <= ref["port"]["number"] <= 65535 and ref.get("failureMode", "FailClose") in (
        "FailOpen", "FailClose")
    objectives = [d for k, d in gateway.items() if k.startswith("InferenceObjective/")]
    assert objectives
    for o in objectives:
        assert o["apiVersion"] == "inference.networking.x-k8s.io/v1alpha2" and isinstance(o["spec"]["priority"], int)
        assert o["spec"]["poolRef"] == {"group": "inference.networking.k8s.io", "name": "mindie-pool"}
    route = gateway["HTTPRoute/mindie-route"]
    (backend,) = route["spec"]["rules"][0]["backendRefs"]
    assert backend == {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "mindie-pool"}


def test_the_configmap_config_is_json_the_service_loads(app):
    raw = json.loads(app["ConfigMap/mindie-service-config"]["data"]["config.json"])
    assert raw["ServerConfig"]["probePort"] not in (raw["ServerConfig"]["port"], raw["ServerConfig"]["managementPort"])
