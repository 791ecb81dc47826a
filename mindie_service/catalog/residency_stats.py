"""What residency knows of each catalog model: its memory as measured around its load, and its counters (loads,
load seconds, evictions by reason, sleeps) that the metrics port shows per model."""
from __future__ import annotations

from dataclasses import dataclass, field

LOAD_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
EVICTION_REASONS = ("idle", "keep_alive", "evicted", "budget", "requested")


@dataclass(frozen=True)
class MeasuredMemory:
    """Bytes one loaded model took, measured as the process's footprint change around its load (RSS on the host,
    allocated bytes on a device): ``weights`` after its engine was built less its KV pool, ``kv_pool`` the pool's
    tensors as allocated (the engine's own count: pages the kernel has not handed out yet are not in the RSS),
    ``workspace`` what the warm-up request added (activations, kernel scratch, caches); ``peak`` the most the load
    took above its start at any moment (the highest RSS read while it ran): the checkpoint's file pages while
    they are read and copies not yet freed come on top of what stays, so a load fits only where its peak does."""

    weights: int
    kv_pool: int
    workspace: int
    device: int = 0  # device memory the load took (0 on the CPU)
    peak: int = 0  # 0: not measured (a measurement made by hand): the fit check counts the total
    # The process's first model load (not a mock's) also pays the runtime's one-time start (torch, the C kernels, the tokenizers: about
    # 240 MiB on the CPU), which is not this model's: the fit check uses the estimate until a later load measures it.
    includes_runtime_start: bool = False

    @property
    def total(self) -> int:
        return self.weights + self.kv_pool + self.workspace

    @property
    def load_need(self) -> int:
        """What loading this model again takes at its highest: its peak, never less than what stays."""
        return max(self.total, self.peak)

    def as_json(self) -> dict[str, int]:
        return {"weights_bytes": self.weights, "kv_pool_bytes": self.kv_pool, "workspace_bytes": self.workspace,
                "device_bytes": self.device, "total_bytes": self.total, "load_peak_bytes": self.peak,
                "includes_runtime_start": self.includes_runtime_start}


@dataclass
class ModelCounters:
    """Since the process started: loads that completed (and failed), their seconds (a histogram's bucket counts),
    unloads by reason, sleeps, and requests that waited for a load."""

    loads: int = 0
    load_failures: int = 0
    load_seconds_sum: float = 0.0
    load_seconds_buckets: list[int] = field(default_factory=lambda: [0] * len(LOAD_SECONDS_BUCKETS))
    evictions: dict[str, int] = field(default_factory=lambda: {r: 0 for r in EVICTION_REASONS})
    sleeps: int = 0
    load_waits: int = 0

    def loaded(self, seconds: float) -> None:
        self.loads += 1
        self.load_seconds_sum += seconds
        for i, b in enumerate(LOAD_SECONDS_BUCKETS):
            if seconds <= b:
                self.load_seconds_buckets[i] += 1

    def unloaded(self, reason: str) -> None:
        self.evictions[reason] = self.evictions.get(reason, 0) + 1
