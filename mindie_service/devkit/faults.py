"""Fault injection into the engine step: a TESTING hook, for the fault tests and ``tools/load_faults.py``.

Set ``MINDIE_SERVICE_FAULTS`` before ``mindie-service serve`` starts (it is read once, at start-up, and
logged as a WARNING); comma-separated ``kind=marker`` entries:

``fail_request=MARK``  the step raises ``RuntimeError`` whenever a request whose prompt text contains MARK
                       is in it: the engine re-runs the step one request at a time, so that request alone
                       fails (424 ``generation``) and the others go on.
``kill_engine=MARK``   the step raises ``EngineDeadError`` when a request whose prompt contains MARK is in it:
                       the engine thread stops, every request in flight fails (500 ``incomplete_generation``)
                       and the server exits with code 3 (``server/main.py``).
``slow_load=SECONDS``  every model's engine build waits SECONDS first (a load long enough to be interrupted:
                       the kill-during-load test).

Never set it in production: anyone who knows a marker can fail requests or stop the service. The hook
wraps the engine's ``runner.execute`` on one engine instance; nothing else in the engine knows of it."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from mindie_service.errors import ConfigError, EngineDeadError

logger = logging.getLogger(__name__)

ENV = "MINDIE_SERVICE_FAULTS"
_KINDS = ("fail_request", "kill_engine", "slow_load")


class InjectedFault(RuntimeError):
    """What ``fail_request`` raises inside the step (an ordinary error: the step isolates it)."""


@dataclass(frozen=True)
class FaultPlan:
    fail_marker: str | None = None
    kill_marker: str | None = None
    slow_load_s: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> "FaultPlan":
        """``"fail_request=@@fail@@,kill_engine=@@die@@"``; ConfigError names a bad entry."""
        found: dict[str, str] = {}
        for entry in (e.strip() for e in spec.split(",")):
            if not entry:
                continue
            kind, sep, marker = entry.partition("=")
            kind, marker = kind.strip(), marker.strip()
            if not sep or kind not in _KINDS or not marker or kind in found:
                raise ConfigError(f"{ENV}: {entry!r} must be one of {', '.join(k + '=MARKER' for k in _KINDS)} "
                                  f"(each at most once, the marker not empty)")
            found[kind] = marker
        slow = found.get("slow_load", "0")
        try:
            slow_s = float(slow)
        except ValueError:
            slow_s = -1.0
        if not 0 <= slow_s <= 3600:
            raise ConfigError(f"{ENV}: slow_load={slow} must be a number of seconds in [0, 3600]")
        return cls(fail_marker=found.get("fail_request"), kill_marker=found.get("kill_engine"), slow_load_s=slow_s)

    @property
    def active(self) -> bool:
        return self.fail_marker is not None or self.kill_marker is not None


def plan_from_env(environ: Mapping[str, str]) -> FaultPlan | None:
    spec = environ.get(ENV, "").strip()
    return FaultPlan.parse(spec) if spec else None


def load_delay(environ: Mapping[str, str]) -> float:
    """Seconds each engine build waits first (``slow_load``), logged as a WARNING; 0 without the variable."""
    plan = plan_from_env(environ)
    if plan is None or not plan.slow_load_s:
        return 0.0
    logger.warning("FAULT INJECTION ACTIVE (%s): this engine build waits %.1f s first", ENV, plan.slow_load_s)
    return plan.slow_load_s


def install(llm: Any, plan: FaultPlan) -> None:
    """Wrap ``llm.runner.execute`` (``llm`` an ``LLMEngine``) so that a step holding a marked request raises."""
    texts: dict[str, str] = {}  # request id -> its prompt text, decoded once

    def prompt_text(rid: str) -> str:
        if rid not in texts:
            seq = llm.scheduler.seqs.get(rid)
            if len(texts) > 4096:  # forget finished requests
                for old in [r for r in texts if r not in llm.scheduler.seqs]:
                    del texts[old]
            texts[rid] = "" if seq is None else llm.tokenizer.decode(list(seq.prompt_token_ids))
        return texts[rid]

    real: Callable[[Any], Any] = llm.runner.execute

    def execute(out: Any) -> Any:
        for chunk in out.chunks:
            text = prompt_text(chunk.request_id)
            if plan.kill_marker is not None and plan.kill_marker in text:
                raise EngineDeadError(f"injected fault: engine death (request {chunk.request_id})")
            if plan.fail_marker is not None and plan.fail_marker in text:
                raise InjectedFault(f"injected fault in the step of request {chunk.request_id}")
        return real(out)

    llm.runner.execute = execute
    logger.warning("FAULT INJECTION ACTIVE (%s, a testing hook; never set it in production): %s", ENV, plan)


def install_from_env(engine: Any, environ: Mapping[str, str]) -> Any:
    """The server's start-up call: ``engine`` (an EngineClient) with the plan of ``environ`` installed, if any.
    The StandardMock has no step to break: a plan there is ignored with a WARNING."""
    plan = plan_from_env(environ)
    if plan is None or not plan.active:
        return engine
    # A lone AsyncEngine holds its LLMEngine as ``engine``; model instances (InstanceRouter) hold ``engines``.
    steps = [getattr(e, "engine", None) for e in getattr(engine, "engines", [engine])]
    if not steps or any(llm is None or not hasattr(llm, "runner") for llm in steps):
        logger.warning("%s is set but %s has no engine step to inject faults into; ignored", ENV,
                       type(engine).__name__)
        return engine
    for llm in steps:
        install(llm, plan)
    return engine
