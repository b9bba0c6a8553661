"""gemmgen's transposing copy on the GPU: exact values in both directions, any size and leading
dimension, nothing written outside the destination; and gemmgen.matmul's copies of operands that
lie the other way go through it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

SENTINEL = -12345.0


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU for PyTorch")


@pytest.mark.parametrize("rows, cols, pad_src, pad_dst", [
    (1, 1, 0, 0), (7, 13, 3, 1), (31, 33, 0, 5), (32, 32, 4, 0), (257, 1029, 3, 7), (4096, 2048, 0, 0),
    (2_200_000, 3, 1, 0)])  # tile rows past the grid's 65535
def test_a_transpose_is_exact_and_writes_only_its_destination(rows, cols, pad_src, pad_dst):
    from gemmgen.gpu.transpose import transpose
    src_buffer = torch.randn(rows, cols + pad_src, device="cuda")
    ld_dst = rows + pad_dst
    dst_buffer = torch.full((cols * ld_dst + 64,), SENTINEL, device="cuda")
    transpose(src_buffer.data_ptr(), rows, cols, cols + pad_src, dst_buffer.data_ptr(), ld_dst, 0,
              torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    dst = dst_buffer[:cols * ld_dst].view(cols, ld_dst)
    assert torch.equal(dst[:, :rows], src_buffer[:, :cols].t())
    assert bool((dst[:, rows:] == SENTINEL).all()) and bool((dst_buffer[cols * ld_dst:] == SENTINEL).all())


@pytest.mark.parametrize("layout", ["row", "col"])
def test_matmul_copies_an_operand_the_other_way_with_it(layout):
    from gemmgen.library import dispatch
    x = torch.randn(300, 517, device="cuda")
    other = x.t().contiguous().t() if layout == "row" else x  # x in the order that is not `layout`
    copied = dispatch._torch_copy(other, layout)
    assert torch.equal(copied, x)
    assert (copied.stride(1) == 1) if layout == "row" else (copied.stride(0) == 1)
