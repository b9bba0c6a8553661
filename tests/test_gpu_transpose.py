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


@pytest.mark.parametrize("batch, gap_src", [(3, 0), (70_000, 5)])  # batches past grid.z's 65535 walked
def test_a_batch_is_transposed_in_one_launch(batch, gap_src):
    from gemmgen.gpu.transpose import transpose
    rows, cols = 5, 3
    step = rows * cols + gap_src
    src = torch.randn(batch * step, device="cuda")
    dst = torch.full((batch * rows * cols + 16,), SENTINEL, device="cuda")
    transpose(src.data_ptr(), rows, cols, cols, dst.data_ptr(), rows, 0, torch.cuda.current_stream().cuda_stream,
              batch, (step, rows * cols))
    torch.cuda.synchronize()
    mats = src.view(batch, step)[:, :rows * cols].view(batch, rows, cols)
    assert torch.equal(dst[:batch * rows * cols].view(batch, cols, rows), mats.mT)
    assert bool((dst[batch * rows * cols:] == SENTINEL).all())


@pytest.mark.parametrize("layout", ["row", "col"])
def test_matmul_copies_a_batch_the_other_way_with_it(layout):
    from gemmgen.library import dispatch
    x = torch.randn(6, 300, 517, device="cuda")[::2]  # every other matrix: batches 2 matrices apart
    other = x.mT.contiguous().mT if layout == "row" else x
    copied = dispatch._torch_copy(other, layout)
    assert torch.equal(copied, x) and copied.shape == (3, 300, 517)
    assert (copied.stride(-1) == 1) if layout == "row" else (copied.stride(-2) == 1)


@pytest.mark.parametrize("layout", ["row", "col"])
def test_matmul_copies_an_operand_the_other_way_with_it(layout):
    from gemmgen.library import dispatch
    x = torch.randn(300, 517, device="cuda")
    other = x.t().contiguous().t() if layout == "row" else x  # x in the order that is not `layout`
    copied = dispatch._torch_copy(other, layout)
    assert torch.equal(copied, x)
    assert (copied.stride(1) == 1) if layout == "row" else (copied.stride(0) == 1)
