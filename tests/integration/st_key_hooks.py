"""Schemathesis hooks (SCHEMATHESIS_HOOKS) of tests/integration/test_control_fuzz.py: the check a run without an
API key holds every response to."""
from __future__ import annotations

from typing import Any

import schemathesis

OPEN = {"/health", "/v2/health/live", "/v2/health/ready"}  # server/auth.OPEN_PATHS: the probes stay open


@schemathesis.check
def refused_without_a_key(ctx: Any, response: Any, case: Any) -> None:
    """A request without a key is refused (401, or 403 for a management route on the business port)."""
    if case.path in OPEN:
        return
    if response.status_code not in (401, 403, 404, 405):  # 404/405: a route or method that is not served
        raise AssertionError(f"{case.method} {case.formatted_path} without a key answered {response.status_code}")
