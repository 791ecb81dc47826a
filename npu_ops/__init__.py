"""Device selection (npu -> cuda -> cpu) and the few hot ops with per-device fast paths.

Only this package (and the one platform module in the engine) names a device."""
from npu_ops.device import DeviceInfo, select_device

__all__ = ["DeviceInfo", "select_device"]
