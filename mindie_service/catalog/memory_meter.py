"""A model's memory, measured: the process's footprint (RSS, and the device's used memory where models run on an
accelerator) read before its engine is built, after it is built, and after its warm-up request, and the RSS's
highest in between (read every few milliseconds by a thread of the meter's while the load runs: the kernel's VmHWM
after a clear_refs reset follows approximate per-CPU counters and missed freed transients by 200 MiB here): a load
holds the checkpoint's pages and copies not yet freed on top of what stays, and only its peak says whether it fits. Loads run one at a
time (catalog/residency.py), so each difference is that model's alone."""
from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any

from mindie_service.catalog.residency_stats import MeasuredMemory
from npu_ops.memory import trim_heap

logger = logging.getLogger(__name__)
SAMPLE_S = 0.005  # how often a load's RSS is read towards its peak (a load takes 70 ms and up)
_measured = [0]  # model loads measured in this process: the first also measures the runtime's one-time start


@functools.lru_cache(maxsize=1)
def _device() -> Any:
    """The device models run on, chosen once (npu_ops.device, as the engines choose it)."""
    import torch  # noqa: PLC0415 (only once a model loads)
    from npu_ops.device import select_device

    return torch.device(select_device().type)


def _device_used() -> int:
    """Bytes used on the accelerator the models run on (0 on the CPU)."""
    from npu_ops.platform import memory_info  # noqa: PLC0415

    device = _device()
    if device.type == "cpu":
        return 0
    free, total = memory_info(device)
    return total - free


def _rss() -> int:
    from npu_ops.memory import rss_bytes  # noqa: PLC0415

    return rss_bytes() or 0


def _live_rss() -> int:
    """The RSS once the C heap's free pages went back (``trim_heap``): what is in use, not what the allocator kept."""
    trim_heap()
    return _rss()


def total_memory() -> int:
    """What a modelMemoryBudget share is of: the accelerator's memory where models run on one, else the host's
    (bounded by a container's limit)."""
    from npu_ops.platform import memory_info  # noqa: PLC0415

    return memory_info(_device())[1]


@dataclass
class LoadMeter:
    """Readings around one load: ``begin`` before the engine is built, ``built`` after, ``warmed`` after its
    warm-up; ``result`` the model's MeasuredMemory. A negative difference (memory another part of the process
    gave back meanwhile) counts as 0."""

    rss0: int = 0
    dev0: int = 0
    rss1: int = 0
    rss2: int = 0
    dev2: int = 0
    hwm: int = 0  # the highest RSS seen over the load
    _watch: threading.Event | None = None

    def begin(self) -> None:
        self.rss0, self.dev0 = _live_rss(), _device_used()
        self.hwm = self.rss0
        self._watch = threading.Event()
        threading.Thread(target=self._follow, args=(self._watch,), name="load-meter", daemon=True).start()

    def sample(self) -> None:
        """One reading of the RSS towards the load's peak (the meter's thread takes one every SAMPLE_S)."""
        self.hwm = max(self.hwm, _rss())

    def _follow(self, watch: threading.Event) -> None:
        while not watch.wait(SAMPLE_S):
            self.sample()

    def stop(self) -> None:
        """End the readings (after the warm-up, or when the load failed)."""
        if self._watch is not None:
            self._watch.set()

    def built(self) -> None:
        self.sample()
        self.rss1 = _live_rss()

    def warmed(self) -> None:
        self.sample()
        self.stop()
        self.rss2, self.dev2 = _live_rss(), _device_used()

    def result(self, engine: Any, mock: bool = False) -> MeasuredMemory:
        """``mock``: a StandardMock load (no torch model: it does not start the runtime, and is not counted)."""
        try:
            kv = int(getattr(engine.stats(), "kv_pool_bytes", 0))
        except Exception:  # noqa: BLE001 - a stats failure leaves the pool unknown, not the load failed
            kv = 0
        device = max(0, self.dev2 - self.dev0)
        built = max(0, self.rss1 - self.rss0)
        on_host = device == 0  # where the pool lives: in the RSS on the CPU, in the device memory elsewhere
        weights = max(0, built - kv) if on_host else built
        _measured[0] += 0 if mock else 1
        peak = max(0, self.hwm - self.rss0)
        return MeasuredMemory(weights=weights, kv_pool=kv, workspace=max(0, self.rss2 - self.rss1), device=device,
                              peak=peak, includes_runtime_start=not mock and _measured[0] == 1)
