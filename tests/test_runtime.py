"""gemmgen.runtime on the CPU: how arrays become (pointer, rows, cols, leading dimension).

Device arrays are stood in for by objects with a `__cuda_array_interface__`; nothing is launched.
"""

from __future__ import annotations

import numpy as np
import pytest

from gemmgen.runtime import ShapeError, as_matrix, stream_handle


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
    with pytest.raises(ShapeError, match="A is not a device array: this ndarray lives in host"):
        as_matrix(np.zeros((4, 4), np.float32), "A", "row")
    with pytest.raises(ShapeError, match="B is not a device array"):
        as_matrix([[1.0, 2.0]], "B", "row")


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
    import gemmgen.runtime as runtime

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
