"""One model of the catalog: its folder, state, engine, and while it starts, how far its load has come."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindie_service.catalog.model_json import ModelRecord
from mindie_service.catalog.residency_stats import MeasuredMemory, ModelCounters
from mindie_service.engine.client import EngineClient
from mindie_service.params.defaults import RequestDefaults


@dataclass
class CatalogEntry:
    id: str
    folder: Path  # the checkpoint folder (a ModelConfig's modelWeightPath, or modelsDir/{id})
    record: ModelRecord
    config_index: int | None = None  # its ModelConfig entry (started at boot), None for a folder model
    mock: bool = False
    state: str = "downloaded"
    engine: EngineClient | None = None
    error: str | None = None  # why the last start or download failed
    progress: dict[str, Any] = field(default_factory=dict)  # download: bytes done / total
    active: int = 0  # requests holding this model (from resolve to their response's end): stop waits for them
    loading_since: float | None = None  # time.monotonic() when its start began (while starting)
    last_load_s: float | None = None  # how long its last start took in this process (the next one's ETA)
    # Residency (catalog/residency.py): when a request last used it (wall clock), when it goes idle-unloaded
    # (monotonic; None = never), what its load measured, and whether residency parked it (unloaded or asleep, to
    # be loaded again by the next request that names it).
    last_used: float | None = None
    idle_since: float | None = None
    keep_alive_s: float | None = None  # the last request's keep_alive (None: the model's idleUnloadSeconds)
    waiting: int = 0  # requests waiting for its load: a model just loaded is theirs before it can be evicted
    memory: MeasuredMemory | None = None
    parked: bool = False
    sleep_level: int = 0  # 1: KV pool freed, 2: weights too (state "sleeping")
    counters: ModelCounters = field(default_factory=ModelCounters)
    # ModelConfig.generationConfig's request defaults (catalog.generation_defaults), under model.json's
    defaults: RequestDefaults = field(default_factory=RequestDefaults)

    def begin_loading(self, phase: str = "loading the weights") -> None:
        self.state, self.error, self.loading_since = "starting", None, time.monotonic()
        self.progress = {"phase": phase}

    def loading_json(self) -> dict[str, Any] | None:
        """While starting: its phase, seconds so far, and seconds left when a previous start says (else None)."""
        if self.state != "starting" or self.loading_since is None:
            return None
        elapsed = time.monotonic() - self.loading_since
        eta = None if self.last_load_s is None else max(0.0, self.last_load_s - elapsed)
        return {"phase": self.progress.get("phase"), "elapsed_s": round(elapsed, 1),
                "eta_s": None if eta is None else round(eta, 1)}

    def loading_message(self) -> str:
        """``the model X is still loading (warming up, 12 s so far, about 30 s left); retry once ...``."""
        info = self.loading_json() or {}
        parts: list[str] = [info["phase"]] if info.get("phase") else []
        if info.get("elapsed_s") is not None:
            parts.append(f"{info['elapsed_s']:.0f} s so far")
        if info.get("eta_s") is not None:
            parts.append(f"about {info['eta_s']:.0f} s left")
        detail = f" ({', '.join(parts)})" if parts else ""
        return f"the model {self.id} is still loading{detail}; retry once GET /health answers 200"

    def loaded(self, engine: EngineClient) -> None:
        """Running from now on; the load's time is kept for the next start's ETA."""
        if self.loading_since is not None:
            self.last_load_s = time.monotonic() - self.loading_since
        self.engine, self.state, self.loading_since, self.progress = engine, "running", None, {}
        self.idle_since, self.parked, self.sleep_level = time.monotonic(), False, 0

    @property
    def owned_folder(self) -> bool:
        return self.config_index is None
