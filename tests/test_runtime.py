"""gemmgen.gpu.runtime on the CPU: how arrays become (pointer, rows, cols, leading dimension), and what a
user hears where there is no driver, no GPU, no CuPy or an array on the host.

Device arrays are stood in for by objects with a `__cuda_array_interface__`; nothing is launched.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import gemmgen.gpu.runtime as runtime
from gemmgen.gpu.runtime import MissingPackageError, NoGpuError, ShapeError, as_matrix, stream_handle


class FakeDeviceArray:
    """Just the __cuda_array_interface__ (v3) of a device array: byte strides, or None if C-contiguous."""

    def __init__(self, shape, strides=None, typestr="<f4", pointer=0x7F0000000000):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (pointer, False),
                                         "strides": strides, "version": 3}


def test_row_major_array_gives_its_row_stride_as_leading_dimension():
    matrix = as_matrix(FakeDeviceArray((6, 5)), "A", "row")
    assert (matrix.rows, matrix.cols, matrix.ld, matrix.layout) == (6, 5, 5, "row")
    padded = as_matrix(FakeDeviceArray((6, 5), strides=(4 * 9, 4)), "A", "row")
    assert padded.ld == 9


def test_column_major_array_gives_its_column_stride_as_leading_dimension():
    matrix = as_matrix(FakeDeviceArray((6, 5), strides=(4, 4 * 6)), "B", "col")
    assert (matrix.rows, matrix.cols, matrix.ld) == (6, 5, 6)
    padded = as_matrix(FakeDeviceArray((6, 5), strides=(4, 4 * 8)), "B", "col")
    assert padded.ld == 8


def test_single_row_or_column_takes_any_layout():
    assert as_matrix(FakeDeviceArray((1, 7)), "C", "col").ld == 1
    assert as_matrix(FakeDeviceArray((7, 1)), "C", "row").ld == 1


@pytest.mark.parametrize("array,layout,message", [
    (FakeDeviceArray((6, 5), typestr="<f8"), "row", "must hold float32"),
    (FakeDeviceArray((2, 6, 5)), "row", r"must be a matrix \(2-D\), not 3-D"),
    (FakeDeviceArray((6, 5)), "col", "is not col-major"),
    (FakeDeviceArray((6, 5), strides=(4, 24)), "row", "is not row-major"),
    (FakeDeviceArray((6, 5), strides=(4 * 5, 8)), "row", "is not row-major"),   # every other column
    (FakeDeviceArray((6, 5), strides=(4 * 5, 2)), "row", "not whole float32 elements"),
])
def test_arrays_a_kernel_cannot_take_raise_shape_errors(array, layout, message):
    with pytest.raises(ShapeError, match=message):
        as_matrix(array, "A", layout)


def test_host_arrays_are_refused_before_any_copy():
    with pytest.raises(ShapeError, match="B is not a device array"):
        as_matrix([[1.0, 2.0]], "B", "row")


def test_a_numpy_array_is_refused_saying_it_is_on_the_host_and_how_to_move_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # no CuPy: the refusal must not need it
    for refuse in (lambda a: as_matrix(a, "A", "row"), lambda a: runtime.device_array(a, "A")):
        with pytest.raises(ShapeError) as caught:
            refuse(np.zeros((4, 4), np.float32))
        assert str(caught.value) == ("A is not a device array: it is a NumPy array in host (CPU) memory; copy "
                                     "it to the GPU first (cupy.asarray(A), or torch.from_numpy(A).cuda())")


class FakeDLPack:
    """An array known only by DLPack, on DLPack device `device_type` (1 the CPU, 2 a GPU)."""

    def __init__(self, device_type):
        self.device_type = device_type

    def __dlpack__(self, stream=None):
        raise AssertionError("read without checking where the array lives")

    def __dlpack_device__(self):
        return (self.device_type, 0)


def test_a_cpu_tensor_is_told_to_move_to_the_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    tensor = type("Tensor", (FakeDLPack,), {"__module__": "torch"})(1)
    with pytest.raises(ShapeError, match=r"^B is not a device array: it is a PyTorch tensor in host \(CPU\) "
                                         r"memory; copy it to the GPU first \(B.cuda\(\)\)$"):
        runtime.device_array(tensor, "B")
    pinned = FakeDLPack(3)
    with pytest.raises(ShapeError, match=r"pinned host \(CUDA host\) memory.*e.g. cupy.asarray\(C\)"):
        as_matrix(pinned, "C", "row")


def test_a_gpu_array_known_only_by_dlpack_without_cupy_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # hidden, as on a machine without it
    with pytest.raises(MissingPackageError) as caught:
        as_matrix(FakeDLPack(2), "A", "row")
    message = str(caught.value)
    assert message.startswith("reading A (a FakeDLPack, by DLPack) needs CuPy, which is not installed: ")
    assert "pip install 'gemmgen[gpu]'" in message and "cupy-cuda13x" in message
    assert "or pass PyTorch CUDA tensors" in message
    assert isinstance(caught.value, ImportError)  # callers that catch ImportError still do


def test_require_cupy_names_what_needs_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(MissingPackageError, match=r"^gemmgen.matmul on NumPy arrays needs CuPy, which is "
                                                  r"not installed: pip install 'gemmgen\[gpu\]'"):
        runtime.require_cupy("gemmgen.matmul on NumPy arrays")


def test_cupy_that_cannot_read_a_dlpack_array_is_a_shape_error_naming_it(monkeypatch):
    class Cupy:
        @staticmethod
        def from_dlpack(array):
            raise TypeError("unsupported device")

    monkeypatch.setitem(sys.modules, "cupy", Cupy)
    with pytest.raises(ShapeError, match=r"^A: CuPy could not read a FakeDLPack by DLPack \(unsupported device\)$"):
        as_matrix(FakeDLPack(2), "A", "row")


def test_stream_handles():
    class CupyLike:
        ptr = 1234

    class TorchLike:
        cuda_stream = 5678

    assert stream_handle(None) == 0
    assert stream_handle(42) == 42
    assert stream_handle(CupyLike()) == 1234
    assert stream_handle(TorchLike()) == 5678


class FakeDriver:
    """The driver calls on_device makes, with one current context per thread (here: one)."""

    class CUresult:
        CUDA_SUCCESS = 0

    def __init__(self, current=0):
        self.current, self.calls = current, []

    def cuInit(self, flags):
        return (0,)

    def cuDeviceGet(self, ordinal):
        return 0, ordinal

    def cuDevicePrimaryCtxRetain(self, device):
        return 0, 100 + device  # a context handle per device

    def cuCtxGetCurrent(self):
        return 0, self.current

    def cuCtxSetCurrent(self, context):
        self.calls.append(context)
        self.current = context
        return (0,)


@pytest.mark.parametrize("before", [0, 100, 101], ids=["no-context", "device-0-current", "device-1-current"])
def test_on_device_makes_the_device_current_and_gives_the_callers_back(monkeypatch, before):
    import gemmgen.gpu.runtime as runtime

    driver = FakeDriver(before)
    monkeypatch.setattr(runtime, "_driver", lambda: driver)
    monkeypatch.setattr(runtime, "_contexts", {})
    with runtime.on_device(1) as context:
        assert context == 101 and driver.current == 101
    assert driver.current == before
    with pytest.raises(KeyError):
        with runtime.on_device(1):
            raise KeyError("a failure inside")
    assert driver.current == before


# --- no driver, no GPU ---------------------------------------------------------------------------

def _driver_library_loads() -> bool:
    try:
        from cuda.bindings import driver
        driver.cuDriverGetVersion()
        return True
    except Exception:  # noqa: BLE001 - what this machine does without one
        return False


NO_DRIVER_HERE = pytest.mark.skipif(_driver_library_loads(), reason="this machine has an NVIDIA driver")


@NO_DRIVER_HERE
@pytest.mark.parametrize("call", ["use_device", "device_info", "on_device", "synchronize", "Kernel"])
def test_without_a_driver_every_entry_point_says_no_driver_and_what_works(monkeypatch, call):
    """This machine has no libcuda.so.1: cuda-python's loader raises DynamicLibNotFoundError at the
    first driver call. The user hears gemmgen's NoGpuError instead, before any compile starts."""
    from gemmgen.plan import make_plan
    from gemmgen.language.load import load_one
    from conftest import SPECS_DIR

    monkeypatch.setattr(runtime, "_driver_module", None)
    monkeypatch.setattr(runtime, "_contexts", {})
    monkeypatch.setattr(runtime, "compile_plan", lambda *a, **k: pytest.fail("compiled before finding no GPU"))
    plan = make_plan(load_one(SPECS_DIR / "naive.gemm"))
    calls = {"use_device": lambda: runtime.use_device(0), "device_info": lambda: runtime.device_info(0),
             "on_device": lambda: runtime.on_device(0).__enter__(), "synchronize": runtime.synchronize,
             "Kernel": lambda: runtime.Kernel(plan)}
    with pytest.raises(NoGpuError) as caught:
        calls[call]()
    assert str(caught.value) == runtime.NO_DRIVER
    assert "no NVIDIA driver found" in str(caught.value) and "gemmgen build and explain work" in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no loader traceback
    assert runtime.device_count() == 0


@pytest.mark.parametrize("status,message", [
    (100, r"^no CUDA GPU found: the NVIDIA driver sees none \(CUDA_ERROR_NO_DEVICE\); check nvidia-smi"),
    (35, r"^the NVIDIA driver is too old for this cuda-python \(CUDA_ERROR_INSUFFICIENT_DRIVER\): update"),
])
def test_a_driver_that_sees_no_gpu_or_is_too_old_says_so(monkeypatch, status, message):
    driver = FakeDriver()
    driver.cuInit = lambda flags: (status,)
    monkeypatch.setattr(runtime, "_driver", lambda: driver)
    monkeypatch.setattr(runtime, "_contexts", {})
    with pytest.raises(NoGpuError, match=message) as caught:
        runtime.use_device(0)
    assert caught.value.code == status


def test_a_gpu_that_does_not_exist_is_named_with_the_count(monkeypatch):
    driver = FakeDriver()
    driver.cuDeviceGet = lambda ordinal: (101, None) if ordinal >= 2 else (0, ordinal)
    driver.cuDeviceGetCount = lambda: (0, 2)
    monkeypatch.setattr(runtime, "_driver", lambda: driver)
    monkeypatch.setattr(runtime, "_contexts", {})
    with pytest.raises(NoGpuError, match=r"^there is no GPU 3: the driver sees 2 GPU\(s\), numbered from 0$"):
        runtime.use_device(3)
    assert runtime.use_device(1) == 101
