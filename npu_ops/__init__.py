"""Device selection (npu -> cuda -> cpu), per-device platform facts (``platform``: memory, KV budget,
staging, dtype, threads) and the few hot ops with per-device fast paths.

Only this package names a device; the engine and the loaders ask ``npu_ops.platform``."""
from npu_ops.device import DeviceInfo, select_device

__all__ = ["DeviceInfo", "select_device"]
