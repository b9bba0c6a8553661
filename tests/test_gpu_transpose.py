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
    (2_200_000, 3, 1, 0),   # tile rows past the grid's 65535 (32-row tiles)
    (4_200_000, 4, 0, 0),   # and past it in 64-row tiles (the float4 kernel)
    (65, 67, 1, 3), (63, 129, 5, 1), (130, 66, 2, 2)])  # the float4 kernel's edges: partial float4s and tiles
@pytest.mark.parametrize("offset", [0, 1])  # floats past 16-byte alignment: 1 takes the float-at-a-time kernel
def test_a_transpose_is_exact_and_writes_only_its_destination(rows, cols, pad_src, pad_dst, offset):
    from gemmgen.gpu.transpose import transpose
    ld_src, ld_dst = cols + pad_src, rows + pad_dst
    src_buffer = torch.randn(rows * ld_src + offset, device="cuda")
    src = src_buffer[offset:].view(rows, ld_src)
    dst_buffer = torch.full((cols * ld_dst + 64 + offset,), SENTINEL, device="cuda")
    transpose(src.data_ptr(), rows, cols, ld_src, dst_buffer.data_ptr() + 4 * offset, ld_dst, 0,
              torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    dst = dst_buffer[offset:offset + cols * ld_dst].view(cols, ld_dst)
    assert torch.equal(dst[:, :rows], src[:, :cols].t())
    assert bool((dst[:, rows:] == SENTINEL).all()) and bool((dst_buffer[offset + cols * ld_dst:] == SENTINEL).all())
    assert bool((dst_buffer[:offset] == SENTINEL).all())


@pytest.mark.parametrize("batch, gap_src", [(3, 0), (70_000, 5), (70_000, 4)])  # batches past grid.z's 65535 walked
@pytest.mark.parametrize("rows, cols", [(5, 3), (8, 4)])  # (8, 4) with gaps of 0 or 4: the float4 kernel
def test_a_batch_is_transposed_in_one_launch(batch, gap_src, rows, cols):
    from gemmgen.gpu.transpose import transpose
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
