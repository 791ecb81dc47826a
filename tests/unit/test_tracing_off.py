"""Request spans cost nothing when off: without ServerConfig.otlpTracesEndpoint nothing of OpenTelemetry's SDK or
exporter is imported (checked in a fresh process); with it set but the SDK missing, start-up is refused saying
which extra to install; with both, the tracer is built (server/tracing.py)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import sys, tempfile
    from pathlib import Path
    from mindie_service.config import load_config
    from mindie_service.errors import ConfigError
    from mindie_service.server.app import make_app
    from mindie_service.server.context import ServerContext
    from tests.server_utils import write_mock_config

    def context(**server):
        ctx = ServerContext(load_config(write_mock_config(Path(tempfile.mkdtemp()), **server)))
        make_app(ctx, ("business", "management", "metrics"))
        return ctx

    def loaded():
        return sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter")))

    print("OFF", context().tracer, loaded())
    on = {"otlpTracesEndpoint": "http://127.0.0.1:9/v1/traces"}
    sys.modules["opentelemetry.sdk"] = None  # as if the tracing extra were not installed
    try:
        context(**on)
    except ConfigError as e:
        print("REFUSED", " ".join(str(e).split()))
    del sys.modules["opentelemetry.sdk"]
    ctx = context(**on)
    print("ON", type(ctx.tracer).__name__, "opentelemetry.sdk.trace" in loaded())
    ctx.tracer.close()
""")


def test_tracing_costs_nothing_off_and_needs_its_extra_on():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "OFF None []"
    assert lines[1].startswith("REFUSED") and "pip install 'mindie-service[tracing]'" in lines[1]
    assert lines[2] == "ON RequestTracer True"
