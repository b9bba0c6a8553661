"""gemmgen's transposing copy (gemmgen/gpu/transpose.py) without a GPU: it compiles for every target,
its grid covers any matrix, and bad leading dimensions are refused before any launch."""

from __future__ import annotations

import pytest

from gemmgen.codegen.cuda import render_template
from gemmgen.gpu import transpose
from gemmgen.gpu.compile import compile_source


@pytest.mark.parametrize("target", ["sm_80", "sm_90"])
def test_the_kernel_compiles_with_nvrtc_for_each_target(target):
    compiled = compile_source(render_template("transpose.cu.j2"), target, list(transpose.KERNELS),
                              filename="transpose.cu", use_cache=False)
    assert all(compiled.lowered_names[name] == name for name in transpose.KERNELS)
    assert compiled.cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("rows, cols, batch", [(1, 1, 1), (31, 33, 7), (32, 32, 1), (4096, 2048, 2),
                                               (3_000_000, 2, 1), (5, 5, 100_000)])
@pytest.mark.parametrize("tile", [transpose.TILE, transpose.VTILE])
def test_the_grid_covers_every_tile_and_walks_rows_and_batches_past_the_grid_limit(rows, cols, batch, tile):
    gx, gy, gz = transpose.grid(rows, cols, batch, tile)
    assert gx * tile >= cols > (gx - 1) * tile
    assert 1 <= gy <= 65535 and 1 <= gz <= 65535
    tiles_down = -(-rows // tile)
    walked = {t for y in range(gy) for t in range(y, tiles_down, gy)}  # the kernel's loop over tile rows
    assert walked == set(range(tiles_down))
    assert {b for z in range(gz) for b in range(z, batch, gz)} == set(range(batch))  # and over batches


def test_short_leading_dimensions_are_refused_before_a_launch():
    with pytest.raises(ValueError, match="leading dimensions 3, 5 below 4, 5"):
        transpose.transpose(0, 5, 4, 3, 0, 5, device=0, stream=0)
    transpose.transpose(0, 0, 4, 4, 0, 1, device=0, stream=0)  # empty: nothing to launch, no GPU asked
    transpose.transpose(0, 5, 4, 4, 0, 5, device=0, stream=0, batch=0)
    with pytest.raises(ValueError, match=r"batch strides \(20, 19\) overlap the destination's matrices \(20 floats"):
        transpose.transpose(0, 5, 4, 4, 0, 5, device=0, stream=0, batch=2, strides=(20, 19))


@pytest.mark.parametrize("src, ld_src, dst, ld_dst, strides, vector", [
    (256, 8, 512, 12, (0, 0), True),
    (260, 8, 512, 12, (0, 0), False),      # a source 4 bytes past 16-byte alignment
    (256, 8, 516, 12, (0, 0), False),      # the destination so
    (256, 9, 512, 12, (0, 0), False),      # rows 9 floats apart: every other row misaligned
    (256, 8, 512, 14, (0, 0), False),
    (256, 8, 512, 12, (96, 96), True),
    (256, 8, 512, 12, (98, 96), False),    # the second matrix of a batch misaligned
    (256, 8, 512, 12, (96, 97), False),
])
def test_the_float4_kernel_takes_only_calls_whose_every_row_is_16_byte_aligned(src, ld_src, dst, ld_dst, strides,
                                                                             vector):
    assert transpose.vectorised(src, ld_src, dst, ld_dst, strides) is vector


# --- the launch, on a faked driver: what reaches cuLaunchKernelEx ---------------------------------

def loaded_on_fake_device(monkeypatch, kernels, functions):
    """`kernels` as if loaded on device 0 (context 0x111, the CUfunctions `functions`), on
    test_launch's stand-in for libcuda, which decodes each launch's arguments by signature."""
    from gemmgen.gpu import copy_kernels
    from test_launch import FakeCuda
    driver = FakeCuda({f: kernels.signature for f in functions}, current=0x7)
    monkeypatch.setattr(copy_kernels, "cuda", lambda: driver)
    monkeypatch.setattr(kernels, "loaded", {0: copy_kernels.Loaded(0x111, functions, kernels.signature)})
    return driver


def test_a_transpose_launch_passes_its_arguments_and_picks_the_float4_kernel_where_rows_align(monkeypatch):
    driver = loaded_on_fake_device(monkeypatch, transpose._KERNELS, [501, 502])
    transpose.transpose(4096, 100, 300, 304, 8192, 100, 0, 9)  # every row 16-byte aligned
    transpose.transpose(4100, 100, 300, 301, 8192, 101, 0, 9, batch=3, strides=(30100, 30300))
    first, second = driver.launches
    assert (first["function"], first["grid"], first["block"], first["stream"]) == \
        (502, transpose.grid(100, 300, 1, transpose.VTILE), (16, 16, 1), 9)
    assert (second["function"], second["grid"], second["block"]) == (501, transpose.grid(100, 300, 3), (32, 8, 1))
    assert second["args"] == {"in": 4100, "rows": 100, "cols": 300, "ld_in": 301, "out": 8192, "ld_out": 101,
                              "batch": 3, "stride_in": 30100, "stride_out": 30300}
    assert first["context"] == second["context"] == 0x111 and driver.current == 0x7  # the caller's again
