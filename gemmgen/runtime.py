"""The old import path of one kernel's runtime, kept for callers: `from gemmgen.runtime import Kernel`
still works. The code lives in gemmgen.gpu.runtime (Kernel, its errors, the device queries)."""

from .gpu.runtime import (CudaError, DeviceInfo, Kernel, MissingPackageError, NoGpuError, ShapeError, device_count,
                          device_info, synchronize)

__all__ = ["CudaError", "DeviceInfo", "Kernel", "MissingPackageError", "NoGpuError", "ShapeError", "device_count",
           "device_info", "synchronize"]
