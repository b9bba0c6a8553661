"""Padding (gemmgen/library/padding.py): an unaligned library call copied into workspace whose rows
are 16-byte aligned and run there by an aligned member. Its geometry; the decision, which the
shipped libraries' .cu makes in C as Python does; and the padded launch on host memory (the copies,
the workspace and the member faked on the CPU, down to raw addresses)."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import numpy as np
import pytest

from fake_device import matrix_at, to_tf32
from host_libraries import LibraryOnHost
from host_program import run_on_host
from gemmgen.codegen.cuda import render_template
from gemmgen.gpu import pad as gpu_pad
from gemmgen.gpu.compile import compile_source
from gemmgen.library import padding as padding_module
from gemmgen.library.manifest import Manifest
from gemmgen.library.padding import PaddedLaunch, padding
from gemmgen.library.selection import alignment_class, choose_padded, pad_ms, short_sum_rows

GENERATED = Path(__file__).resolve().parent.parent / "generated"
SHIPPED = [name for name in ("fp32", "tf32") if (GENERATED / f"{name}.json").is_file()]
ROW_COL = {"A": "row", "B": "col", "C": "row"}


# --- the copy kernel ---------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["sm_80", "sm_90"])
def test_the_copy_kernels_compile_with_nvrtc_for_each_target(target):
    compiled = compile_source(render_template("pad.cu.j2"), target, list(gpu_pad.KERNELS), filename="pad.cu",
                              use_cache=False)
    assert all(compiled.lowered_names[name] == name for name in gpu_pad.KERNELS)
    assert compiled.cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("rows, cols, batch", [(1, 1, 1), (31, 1025, 7), (4096, 4097, 1), (3_000_000, 3, 1),
                                               (5, 5, 100_000)])
def test_the_grid_covers_every_column_and_walks_every_row_of_every_matrix(rows, cols, batch):
    gx, gy, gz = gpu_pad.grid(rows, cols, batch)
    span = gpu_pad.THREADS * gpu_pad.UNROLL
    assert gx * span >= cols > (gx - 1) * span and gz == 1
    assert 1 <= gy <= 65535
    assert sum(len(range(y, rows * batch, gy)) for y in range(gy)) == rows * batch  # the kernel's row loop


def test_short_leading_dimensions_are_refused_before_a_launch():
    with pytest.raises(ValueError, match="leading dimensions 3, 8 below 4"):
        gpu_pad.pad(0, 2, 4, 3, 0, 0, 8, 0, 1, 0, 0)


@pytest.mark.parametrize("answer,status,capturing", [(0, 0, False), (0, 1, True), (1, 0, True)])
def test_a_stream_that_captures_or_cannot_say_takes_no_workspace(monkeypatch, answer, status, capturing):
    """cuStreamIsCapturing's error (the legacy stream while another thread captures) counts as
    capturing, as in the .cu: the unaligned member runs, nothing raises."""
    class Driver:
        def cuStreamIsCapturing(self, stream, out):
            out._obj.value = status
            return answer
    monkeypatch.setattr(gpu_pad, "cuda", lambda: Driver())
    assert gpu_pad.capturing(0) is capturing


def test_release_workspace_trims_only_pools_that_exist(monkeypatch):
    """gemmgen.release_workspace is gpu/pad.py's release: nothing to do (and no driver needed) before
    a call padded; afterwards the device's pool is trimmed once its queued work is done."""
    import gemmgen
    assert gemmgen.release_workspace is gpu_pad.release
    monkeypatch.setattr(gpu_pad, "_pools", {})
    assert gpu_pad.release() == 0
    calls = []

    class Driver:
        def cuCtxSynchronize(self):
            calls.append("sync")
            return 0

        def cuMemPoolTrimTo(self, pool, size):
            calls.append(("trim", pool.value, size.value))
            return 0

    monkeypatch.setattr(gpu_pad, "cuda", lambda: Driver())
    monkeypatch.setattr(gpu_pad, "current", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(gpu_pad, "_pools", {0: 1234, 1: 99})
    assert gpu_pad.release(1) == 1
    assert calls == ["sync", ("trim", 99, 0)]
    calls.clear()
    assert gpu_pad.release() == 2 and calls == ["sync", ("trim", 1234, 0), "sync", ("trim", 99, 0)]


# --- which operands are copied, and where -----------------------------------------------------------

def test_an_aligned_call_and_a_call_without_k_pad_nothing():
    assert padding(ROW_COL, 64, 64, 64, (64, 64, 64), (0, 0, 0), 1, (0, 0, 0)) is None
    assert padding(ROW_COL, 64, 64, 0, (65, 65, 65), (0, 0, 0), 1, (0, 0, 0)) is None  # A and B unread


def test_only_the_unaligned_operand_is_copied_into_rows_of_whole_128_bytes():
    p = padding(ROW_COL, 100, 50, 33, (33, 36, 52), (0, 0, 0), 1, (0, 0, 0))
    (a,) = p.parts
    assert (a.name, a.rows, a.cols, a.ld, a.new_ld, a.offset) == ("A", 100, 33, 33, 64, 0)
    assert p.lds == (64, 36, 52) and p.strides == (0, 0, 0)
    assert p.floats == 6400  # 100 rows of 64
    # rows of 4 mod 8 floats would leave the padded call split (a TMA member up to 2x slower)
    assert alignment_class(*padding(ROW_COL, 64, 64, 4099, (4099, 4099, 64), (0, 0, 0), 1, (0, 0, 0)).lds) == "aligned"
    assert alignment_class(*p.lds) == "split"  # B, not copied, has rows of 36 floats


def test_a_pointer_off_16_bytes_pads_its_operand_by_its_stored_rows():
    p = padding({"A": "col", "B": "row", "C": "col"}, 10, 20, 30, (12, 20, 12), (0, 4, 0), 1, (0, 0, 0))
    (b,) = p.parts  # B row-major: K rows of N floats
    assert (b.name, b.rows, b.cols, b.new_ld) == ("B", 30, 20, 32)
    p = padding({"A": "col", "B": "row", "C": "col"}, 10, 20, 30, (12, 20, 13), (0, 0, 0), 1, (0, 0, 0))
    (c,) = p.parts  # C column-major: N rows of M floats
    assert (c.name, c.rows, c.cols, c.new_ld) == ("C", 20, 10, 32)


def test_batches_keep_one_matrix_each_and_a_broadcast_operand_is_copied_once():
    p = padding(ROW_COL, 8, 8, 7, (7, 7, 8), (0, 0, 0), 5, (0, 63, 64))
    a, b = p.parts
    assert (a.count, a.stride, a.new_stride) == (1, 0, 0)
    assert (b.count, b.stride, b.new_ld, b.new_stride) == (5, 63, 32, 256)
    assert b.offset == 256  # after A's 8 rows of 32
    assert p.strides == (0, 256, 64)  # C was aligned: its own stride


def test_the_copies_cost_two_passes_over_their_floats_and_c_two_more_when_beta_reads_it():
    p = padding(ROW_COL, 1000, 1000, 1001, (1001, 1001, 1001), (0, 0, 0), 1, (0, 0, 0))
    assert p.copies(False) == [(1, 1000, 1001), (1, 1000, 1001), (1, 1000, 1000)]  # A, B, C out
    assert p.copies(True) == p.copies(False) + [(1, 1000, 1000)]                    # and C in
    assert pad_ms(p.copies(True)) > pad_ms(p.copies(False)) > 8 * 3 * 1000 * 1000 / 1e9 / 2.6


# --- the decision ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SHIPPED)
def test_big_unaligned_calls_pad_and_small_ones_do_not(name):
    candidates = Manifest.read(GENERATED / f"{name}.json").candidates()
    for size, pays in [(4096, True), (5003, True), (64, False), (300, False)]:
        ld = size + 1 if size % 2 == 0 else size
        p = padding(ROW_COL, size, size, size, (ld, ld, ld), (0, 0, 0), 1, (0, 0, 0))
        chosen = choose_padded(candidates, size, size, size, p.copies(False), 132, beta_used=False)
        assert (chosen >= 0) == pays, (size, chosen)
        if pays:
            assert candidates[chosen].models.get("aligned") is not None


def _pays_in_c(source: str, name: str, cases, binary: Path) -> list[bool]:
    start = source.index(f"namespace gemmgen_{name}_choice {{")
    end = source.index(f"}}  // namespace gemmgen_{name}_choice", start)
    program = "#include <math.h>\n#include <stdio.h>\n" + source[start:end] + "}\n" + f"""
int main() {{
    int M, N, K, split, beta, batch, n;
    while (scanf("%d %d %d %d %d %d %d", &M, &N, &K, &split, &beta, &batch, &n) == 7) {{
        gemmgen_{name}_choice::Copy copies[4];
        for (int i = 0; i < n; ++i) scanf("%lld %lld %lld", &copies[i].count, &copies[i].rows, &copies[i].cols);
        printf("%d\\nend\\n", gemmgen_{name}_choice::padding_pays(M, N, K, copies, n, split, 132, beta, true, batch) ? 1 : 0);
    }}
}}
"""
    feed = "\n".join(f"{M} {N} {K} {int(split)} {int(beta)} {batch} {len(copies)} "
                     + " ".join(f"{c} {r} {w}" for c, r, w in copies)
                     for M, N, K, split, beta, batch, copies in cases)
    runs, _ = run_on_host(program, feed, binary)
    return [bool(rows[0][0]) for rows in runs]


@pytest.mark.parametrize("name", SHIPPED)
def test_the_cu_pads_where_python_pads(name, tmp_path):
    """Random unaligned calls (any operands off, beta or not, batches): the shipped .cu's padding_pays
    agrees with selection.choose_padded, and both pad somewhere and somewhere not."""
    manifest = Manifest.read(GENERATED / f"{name}.json")
    candidates, exact_rows = manifest.candidates(), short_sum_rows(manifest.precision)
    rng = random.Random(11)
    cases = []
    for _ in range(400):
        M, N, K = (int(2 ** rng.uniform(0, 13.5)) for _ in range(3))
        batch = 1 if rng.random() < 0.7 else int(2 ** rng.uniform(1, 6))
        beta = rng.random() < 0.3
        lds = tuple(x + rng.choice([0, 1, 3, 4]) for x in (K, K, N))
        strides = tuple(rng.choice([0, rows * ld, rows * ld + 1]) if batch > 1 else 0
                        for rows, ld in ((M, lds[0]), (N, lds[1]), (M, lds[2])))
        strides = strides[:2] + (M * lds[2] + (strides[2] % 4 if batch > 1 else 0),)
        p = padding(ROW_COL, M, N, K, lds, (0, 0, 0), batch, strides)
        if p is not None:
            split = alignment_class(*p.lds, strides=p.strides) == "split"  # B (or A) not copied, rows of 4 mod 8
            cases.append((M, N, K, split, beta, batch, p.copies(beta)))
    python = [choose_padded(candidates, M, N, K, copies, 132, beta_used=beta, batch=batch,
                            padded_class="split" if split else "aligned", exact_rows=exact_rows) >= 0
              for M, N, K, split, beta, batch, copies in cases]
    assert any(case[3] for case in cases)
    assert _pays_in_c((GENERATED / f"{name}.cu").read_text(), name, cases, tmp_path / "pays") == python
    assert any(python) and not all(python)


# --- the padded launch, on host memory --------------------------------------------------------------

class HostPadding:
    """gpu/pad.py on the CPU: workspace from numpy, the copy kernel as numpy copies (rounded to TF32
    where asked), a stream that captures a graph or not."""

    def __init__(self, monkeypatch, capturing=False, memory=True):
        self.buffers, self.freed, self.copies = {}, [], []
        self.capture, self.memory = capturing, memory
        monkeypatch.setattr(padding_module, "gpu_pad", self)

    def current(self, device):
        return contextlib.nullcontext()

    def capturing(self, stream):
        return self.capture

    def allocate(self, device, stream, nbytes):
        if not self.memory:
            return 0
        buffer = np.full(nbytes // 4 + 4, np.nan, np.float32)
        address = buffer.__array_interface__["data"][0]
        address += -address % 16
        self.buffers[address] = buffer
        return address

    def free(self, address, stream):
        self.freed.append(address)

    def pad(self, src, rows, cols, ld_src, stride_src, dst, ld_dst, stride_dst, batch, device, stream,
            round_tf32=False):
        self.copies.append((rows, cols, ld_src, ld_dst, batch, round_tf32))
        for i in range(batch):
            into = matrix_at(dst + 4 * i * stride_dst, rows, cols, ld_dst, 1)
            values = matrix_at(src + 4 * i * stride_src, rows, cols, ld_src, 1)
            into[...] = to_tf32(values) if round_tf32 else values


def _buffer(rng, lines, ld, count=1, stride=None):
    stride = lines * ld if stride is None else stride
    data = np.full((count - 1) * stride + lines * ld + 8, np.nan, np.float32)
    for i in range(count):
        data[i * stride: i * stride + lines * ld].reshape(lines, ld)[...] = rng.uniform(-1, 1, (lines, ld))
    return data


def _address(array, offset=0):
    return array.__array_interface__["data"][0] + 4 * offset


def _launch(M, N, K, lds, batch, strides, round_tf32=False, beta_used=True):
    p = padding(ROW_COL, M, N, K, lds, (0, 0, 0), batch, strides)
    member = LibraryOnHost(("row", "col"))
    aligned = member.prepare(M, N, K, *p.lds, (0, 0, 0), beta_used, batch, p.strides)
    fallback_calls = []
    fallback = lambda *args: fallback_calls.append(args)  # noqa: E731 - the unaligned member
    return PaddedLaunch(p, 3, aligned, fallback, 0, round_tf32), member, fallback_calls


def test_a_padded_call_computes_the_product_and_writes_only_c(monkeypatch):
    host = HostPadding(monkeypatch)
    rng = np.random.default_rng(3)
    M, N, K, lda, ldb, ldc = 37, 29, 41, 43, 42, 31
    a, b, c = _buffer(rng, M, lda), _buffer(rng, N, ldb), _buffer(rng, M, ldc)
    A = a[:M * lda].reshape(M, lda)[:, :K].astype(np.float64)
    B = b[:N * ldb].reshape(N, ldb)[:, :K].T.astype(np.float64)
    C0 = c[:M * ldc].reshape(M, ldc)[:, :N].astype(np.float64)
    before = c.copy()
    run, member, fallback_calls = _launch(M, N, K, (lda, ldb, ldc), 1, (0, 0, 0))
    run(_address(a), _address(b), _address(c), 1.5, -0.5, 0)
    out = c[:M * ldc].reshape(M, ldc)[:, :N]
    np.testing.assert_allclose(out, 1.5 * A @ B - 0.5 * C0, rtol=1e-5, atol=1e-5)
    gaps = np.ones_like(c, bool)
    gaps[:M * ldc].reshape(M, ldc)[:, :N] = False
    np.testing.assert_array_equal(c[gaps], before[gaps])  # the row ends and past C untouched
    assert member.calls == [(M, N, K)] and not fallback_calls
    assert [copy[:2] for copy in host.copies] == [(M, K), (N, K), (M, N), (M, N)]  # A, B, C in, C out
    assert host.freed == list(host.buffers)  # the workspace given back


def test_beta_zero_does_not_read_c(monkeypatch):
    host = HostPadding(monkeypatch)
    rng = np.random.default_rng(4)
    M, N, K = 12, 10, 9
    a, b = _buffer(rng, M, 9), _buffer(rng, N, 9)
    c = np.full(M * 11 + 4, np.nan, np.float32)  # NaN would spread if beta's C were read
    run, _, _ = _launch(M, N, K, (9, 9, 11), 1, (0, 0, 0), beta_used=False)
    run(_address(a), _address(b), _address(c), 1.0, 0.0, 0)
    assert not np.isnan(c[:M * 11].reshape(M, 11)[:, :N]).any()
    assert [copy[:2] for copy in host.copies] == [(M, K), (N, K), (M, N)]  # no C in


def test_a_batch_with_a_broadcast_operand_and_odd_strides(monkeypatch):
    HostPadding(monkeypatch)
    rng = np.random.default_rng(5)
    batch, M, N, K = 4, 6, 5, 7
    lda, ldb, ldc = 7, 9, 5
    stride_b, stride_c = N * ldb + 1, M * ldc + 3
    a = _buffer(rng, M, lda)  # stride 0: one A for every batch
    b = _buffer(rng, N, ldb, batch, stride_b)
    c = _buffer(rng, M, ldc, batch, stride_c)
    A = a[:M * lda].reshape(M, lda)[:, :K].astype(np.float64)
    expected = []
    for i in range(batch):
        B = b[i * stride_b: i * stride_b + N * ldb].reshape(N, ldb)[:, :K].T.astype(np.float64)
        C = c[i * stride_c: i * stride_c + M * ldc].reshape(M, ldc)[:, :N].astype(np.float64)
        expected.append(A @ B + 2.0 * C)
    run, member, _ = _launch(M, N, K, (lda, ldb, ldc), batch, (0, stride_b, stride_c))
    run(_address(a), _address(b), _address(c), 1.0, 2.0, 0)
    for i in range(batch):
        out = c[i * stride_c: i * stride_c + M * ldc].reshape(M, ldc)[:, :N]
        np.testing.assert_allclose(out, expected[i], rtol=1e-5, atol=1e-5)
    assert member.calls == [(batch, M, N, K)]


def test_the_tf32_copies_round_a_and_b_to_nearest_and_leave_c(monkeypatch):
    host = HostPadding(monkeypatch)
    rng = np.random.default_rng(6)
    M, N, K = 8, 8, 5
    a, b, c = _buffer(rng, M, 5), _buffer(rng, N, 5), _buffer(rng, M, 8)
    A, B = (matrix_at(_address(x), rows, 5, 5, 1).astype(np.float64) for x, rows in ((a, M), (b, N)))
    C = c[:64].reshape(8, 8).astype(np.float64)
    run, _, _ = _launch(M, N, K, (5, 5, 8), 1, (0, 0, 0), round_tf32=True)
    run(_address(a), _address(b), _address(c), 1.0, 1.0, 0)
    expected = to_tf32(A).astype(np.float64) @ to_tf32(B).astype(np.float64).T + C
    np.testing.assert_allclose(c[:64].reshape(8, 8), expected, rtol=1e-6, atol=1e-6)
    assert [copy[5] for copy in host.copies] == [True, True]  # A and B rounded; C aligned, not copied


@pytest.mark.parametrize("capturing,memory", [(True, True), (False, False)])
def test_without_workspace_the_unaligned_member_runs(monkeypatch, capturing, memory):
    """During a CUDA graph capture no workspace is taken; where the GPU has no memory for it, none is."""
    host = HostPadding(monkeypatch, capturing=capturing, memory=memory)
    run, member, fallback_calls = _launch(64, 64, 63, (63, 63, 64), 1, (0, 0, 0))
    run(16, 32, 48, 1.0, 0.0, 7)
    assert fallback_calls == [(16, 32, 48, 1.0, 0.0, 7)]
    assert not member.calls and not host.copies and not host.buffers


def test_a_pad_launch_passes_its_arguments_and_rounds_with_the_tf32_kernel(monkeypatch):
    from test_transpose import loaded_on_fake_device
    driver = loaded_on_fake_device(monkeypatch, gpu_pad._KERNELS, [601, 602])
    gpu_pad.pad(1000, 70000, 33, 33, 0, 5000, 36, 0, 1, 0, 4)
    gpu_pad.pad(1000, 8, 7, 7, 63, 5000, 8, 64, 5, 0, 4, round_tf32=True)
    first, second = driver.launches
    assert (first["function"], first["grid"], first["block"], first["stream"]) == (601, (1, 65535, 1), (256, 1, 1), 4)
    assert (second["function"], second["grid"]) == (602, gpu_pad.grid(8, 7, 5))
    assert second["args"] == {"in": 1000, "rows": 8, "cols": 7, "ld_in": 7, "stride_in": 63, "out": 5000,
                              "ld_out": 8, "stride_out": 64, "batch": 5}


def test_the_runtime_pads_an_unaligned_call_that_pays_once_per_call_key(monkeypatch):
    """LibraryRuntime.launch of the shipped tf32 library on a faked H100: 1531^3 with odd leading
    dimensions pads (the aligned member runs on copies, rounded to TF32, and C comes back), the
    padded launch is made once for its call key, and a small call runs its unaligned member as it is."""
    import gemmgen.library.runtime as library_runtime
    from fake_device import INFO
    HostPadding(monkeypatch)
    monkeypatch.setattr(library_runtime, "device_info", lambda ordinal=0: INFO)
    runtime = library_runtime.LibraryRuntime(Manifest.read(GENERATED / "tf32.json"))
    member, made = LibraryOnHost(("row", "col")), []

    class Member:  # every member computes on the host
        def __init__(self, index):
            self.index = index

        def prepare(self, *args):
            made.append((self.index,) + args[:6])
            return member.prepare(*args)

        def launch(self, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream=None, batch=1, strides=(0, 0, 0)):
            member.launch(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream, batch, strides)

    monkeypatch.setattr(runtime, "kernel", Member)
    rng = np.random.default_rng(8)
    n = 1531
    a, b, c = _buffer(rng, n, n), _buffer(rng, n, n), np.full(n * n + 8, np.nan, np.float32)
    for _ in range(2):
        chosen = runtime.launch(n, n, n, 1.0, _address(a), n, _address(b), n, 0.0, _address(c), n)
    assert runtime.manifest.candidates()[chosen].models.get("aligned") is not None
    A, B = (to_tf32(x[:n * n].reshape(n, n)).astype(np.float64) for x in (a, b))
    np.testing.assert_allclose(c[:n * n].reshape(n, n), A @ B.T, rtol=1e-4, atol=1e-3)
    padded_lds = [args[4:7] for args in made if args[4:7] == (1536, 1536, 1536)]
    assert len(padded_lds) == 1  # the aligned member prepared once, on rows of 1536 floats (128-byte rows)
    assert member.calls == [(n, n, n)] * 2
    small = _buffer(rng, 64, 63)
    runtime.launch(64, 64, 63, 1.0, _address(small), 63, _address(small), 63, 0.0, _address(c), 64)
    assert member.calls[-1] == (64, 64, 63) and member.pointers[-1][0] == _address(small)  # as it is
