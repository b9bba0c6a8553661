"""gemmgen.matmul's routing on the CPU: which library, swapped or not, and what is copied.

Layouts are decided by layouts.route (pure); the general path (CuPy, __cuda_array_interface__) is
run end to end on host memory, with libraries that multiply on the host in their operand class.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from conftest import ROOT
from gemmgen.library.layouts import CLASSES, Operand, c_layout_of, library_name, readings, route, transposed
from host_libraries import HostArray, LibraryOnHost

ALL = frozenset(CLASSES)
BASE = frozenset({("row", "col")})


def matrix(name, rows, cols, layout, pad=0):
    """An Operand dense in `layout` (rows `pad` floats longer)."""
    if layout == "row":
        return Operand(name, rows, cols, (cols + pad, 1))
    return Operand(name, rows, cols, (1, rows + pad))


# --- readings ------------------------------------------------------------------------------------

def test_readings_of_dense_padded_single_line_and_strided_matrices():
    assert readings(6, 5, 5, 1) == {"row": 5}
    assert readings(6, 5, 9, 1) == {"row": 9}
    assert readings(6, 5, 1, 6) == {"col": 6}
    assert readings(6, 5, 1, 8) == {"col": 8}
    assert readings(1, 7, 7, 1) == {"row": 7, "col": 1}     # a single row reads either way
    assert readings(7, 1, 1, 7) == {"row": 1, "col": 7}
    assert readings(6, 5, 10, 2) == {}                        # every other column: no unit stride
    assert readings(6, 5, 0, 1) == {}                         # a broadcast row: rows overlap
    assert readings(6, 5, 1, 3) == {}                         # columns overlap
    assert transposed({"row": 9}) == {"col": 9}


# --- routes --------------------------------------------------------------------------------------

# (A, B, C) layouts -> (the library's class, swapped): a column-major C is C^T = B^T A^T.
ROUTES = {("row", "col", "row"): (("row", "col"), False), ("row", "row", "row"): (("row", "row"), False),
          ("col", "col", "row"): (("col", "col"), False), ("col", "row", "row"): (("col", "row"), False),
          ("row", "col", "col"): (("row", "col"), True), ("row", "row", "col"): (("col", "col"), True),
          ("col", "col", "col"): (("row", "row"), True), ("col", "row", "col"): (("col", "row"), True)}


@pytest.mark.parametrize("layouts", list(ROUTES), ids=["A%s-B%s-C%s" % k for k in ROUTES])
def test_every_layout_of_a_b_and_c_has_a_library_without_a_copy(layouts):
    la, lb, lc = layouts
    a, b, c = matrix("A", 37, 53, la, pad=3), matrix("B", 53, 29, lb, pad=1), matrix("out", 37, 29, lc, pad=2)
    way = route(a, b, c, ALL)
    assert (way.klass, way.swap) == ROUTES[layouts]
    assert not way.copies and way.reasons == ()
    # leading dimensions of the library's A, B and C: the operands' own (swapped with C^T)
    lds = {"A": a.reading[la], "B": b.reading[lb], "C": c.reading[lc]}
    assert way.lds == ((lds["B"], lds["A"], lds["C"]) if way.swap else (lds["A"], lds["B"], lds["C"]))


def test_without_a_layouts_library_one_operand_is_copied_and_the_reason_names_it():
    a, b, c = matrix("A", 37, 53, "row"), matrix("B", 53, 29, "row"), matrix("out", 37, 29, "row")
    way = route(a, b, c, BASE, "tf32")
    assert (way.klass, way.swap, way.copy_a, way.copy_b, way.copy_c) == (("row", "col"), False, None, "col", False)
    (reason,) = way.reasons
    assert reason == ("B of shape (53, 29) with strides (29, 1) is row-major; gemmgen's tf32 kernels read it "
                      "col-major in this call (K contiguous), so it is copied col-major first (one pass over it)")
    # C column-major over the base class's operands: C^T = B^T A^T is the base class again, no copy
    way = route(matrix("A", 37, 53, "row"), matrix("B", 53, 29, "col"), matrix("out", 37, 29, "col"), BASE)
    assert (way.klass, way.swap, way.copies) == (("row", "col"), True, False)
    # A^T B^T written into C^T: both operands would need copying through the base class unless
    # C is read the other way, so with C column-major the route copies one, not two
    way = route(matrix("A", 37, 53, "col"), matrix("B", 53, 29, "row"), matrix("out", 37, 29, "row"), BASE)
    assert (way.copy_a, way.copy_b) == ("row", "col")


def test_the_relaid_fp32_classes_leave_one_copy_only_for_a_col_b_row():
    """fp32 serves A col, B col in the kernel writing C row- or column-major (layouts.RELAID): no copy
    there, none for A row, B row (C^T = B^T A^T, both column-major, into C^T column-major), and one
    (not both), the smaller operand's, for A col, B row."""
    fp32 = BASE | {("col", "col"), ("col", "col", "col")}
    way = route(matrix("A", 64, 96, "col"), matrix("B", 96, 80, "col"), matrix("out", 64, 80, "row"), fp32)
    assert (way.klass, way.swap, way.copies) == (("col", "col"), False, False)
    way = route(matrix("A", 64, 96, "row"), matrix("B", 96, 80, "row"), matrix("out", 64, 80, "row"), fp32)
    assert (way.klass, way.swap, way.copies) == (("col", "col", "col"), True, False)
    assert way.lds == (80, 96, 80)  # B^T, A^T and C^T column-major: B's, A's and C's row strides
    way = route(matrix("A", 64, 96, "row"), matrix("B", 96, 80, "row"), matrix("out", 64, 80, "col"), fp32)
    assert (way.klass, way.swap, way.copies) == (("col", "col"), True, False)
    # A col, B row: one copy either way, the smaller operand's: B (96 x 80) into fp32_cc, or A (64 x 96)
    # through fp32_cc_ccol (C^T = B^T A^T, B^T column-major as it lies)
    way = route(matrix("A", 64, 96, "col"), matrix("B", 96, 80, "row"), matrix("out", 64, 80, "row"), fp32)
    assert (way.klass, way.swap, way.copy_a, way.copy_b) == (("col", "col", "col"), True, "row", None)
    way = route(matrix("A", 64, 96, "col"), matrix("B", 96, 48, "row"), matrix("out", 64, 48, "row"), fp32)
    assert (way.klass, way.swap, way.copy_a, way.copy_b) == (("col", "col"), False, None, "col")
    # an output with no unit stride: into a row-major copy, through a class that writes C row-major
    way = route(matrix("A", 64, 96, "row"), matrix("B", 96, 80, "row"), Operand("out", 64, 80, (160, 2)), fp32)
    assert way.copy_c and c_layout_of(way.klass) == "row" and not way.swap
    assert library_name("fp32", ("col", "col", "col")) == "fp32_cc_ccol"


def test_an_operand_with_no_unit_stride_is_copied_whatever_is_built():
    a = Operand("A", 8, 6, (12, 2))                     # every other column of an 8 x 12 matrix
    b, c = matrix("B", 6, 5, "col"), matrix("out", 8, 5, "row")
    way = route(a, b, c, ALL)
    assert (way.klass, way.copy_a, way.copy_b) == (("row", "col"), "row", None)
    assert way.reasons == ("A of shape (8, 6) with strides (12, 2) has no unit stride; copying it",)


def test_an_output_with_no_unit_stride_is_computed_into_a_copy():
    a, b = matrix("A", 8, 6, "row"), matrix("B", 6, 5, "col")
    way = route(a, b, Operand("out", 8, 5, (20, 2)), ALL)
    assert way.copy_c and not way.swap and way.klass == ("row", "col") and way.lds[2] == 5
    assert "out of shape (8, 5) with strides (20, 2) has no unit stride" in way.reasons[0]


def test_vectors_take_the_base_library_as_they_are():
    # x (1 x K) times W^T: x reads either way, so no class but the base is needed, with or without the others
    x, w_t, y = Operand("A", 1, 64, (64, 1)), matrix("B", 64, 32, "col"), Operand("out", 1, 32, (32, 1))
    for available in (ALL, BASE):
        way = route(x, w_t, y, available)
        assert (way.klass, way.swap, way.copies) == (("row", "col"), False, False)


def test_a_matrix_times_a_column_vector_runs_as_the_row_vector_times_its_transpose():
    """C = A x with C a column vector reads either way: the library computes C^T = x^T A^T, one row
    (which the decode members serve) rather than one column of a tile member's 128."""
    a, x, y = matrix("A", 4096, 512, "row", pad=4), Operand("B", 512, 1, (1, 1)), Operand("out", 4096, 1, (1, 1))
    for available in (ALL, BASE):
        way = route(a, x, y, available)
        assert (way.klass, way.swap, way.copies) == (("row", "col"), True, False)
        assert way.lds == (512, 516, 4096)  # x^T as a row, A^T column-major (A's rows), C^T one row
    # a column of a wider output (no unit stride down it, rows ldc apart) reads only row-major: kept
    way = route(a, x, Operand("out", 4096, 1, (8, 1)), BASE)
    assert (way.klass, way.swap, way.copies) == (("row", "col"), False, False)
    # a row vector is the library's one row already; a single value stays as it is
    for rows, cols in ((1, 4096), (1, 1)):
        way = route(Operand("A", rows, 512, (512, 1)), matrix("B", 512, cols, "col"),
                    Operand("out", rows, cols, (cols, 1)), BASE)
        assert (way.swap, way.copies) == (False, False)


def test_matmul_of_a_matrix_and_a_column_vector_calls_the_library_with_one_row(host_libraries):
    import gemmgen
    libraries, copies = host_libraries
    rng = np.random.default_rng(5)
    A, x = rng.uniform(-1, 1, (300, 70)).astype(np.float32), rng.uniform(-1, 1, (70, 1)).astype(np.float32)
    out = HostArray(np.zeros((300, 1), np.float32))
    gemmgen.matmul(HostArray(A), HostArray(x), out)
    np.testing.assert_allclose(out.values, A.astype(np.float64) @ x, rtol=1e-5, atol=1e-5)
    assert libraries[("row", "col")].calls == [(1, 300, 70)] and copies == []


def test_library_names_say_the_operand_class():
    assert [library_name("fp32", k) for k in CLASSES] == ["fp32", "fp32_rr", "fp32_cc", "fp32_cr"]
    with pytest.raises(ValueError, match="must be available"):
        route(matrix("A", 2, 2, "row"), matrix("B", 2, 2, "col"), matrix("out", 2, 2, "row"), frozenset())


# --- the general path, on host memory --------------------------------------------------------------

@pytest.fixture
def host_libraries(monkeypatch):
    """Libraries of every class on the host; `copies` counts the copies gemmgen.matmul makes."""
    import gemmgen.library.dispatch as dispatch
    libraries = {klass: LibraryOnHost(klass) for klass in CLASSES}
    copies = []

    def copy(array, layout, lead=()):
        copies.append(layout)
        values = array.values
        if values.ndim > 2:  # a batch: broadcast to the call's batches, each matrix dense in `layout`
            values = np.broadcast_to(values, lead + values.shape[-2:])
            dense = np.ascontiguousarray(values if layout == "row" else values.swapaxes(-1, -2))
            return HostArray(dense if layout == "row" else dense.swapaxes(-1, -2))
        return HostArray(np.ascontiguousarray(values) if layout == "row" else np.asfortranarray(values))

    monkeypatch.setattr(dispatch, "library", lambda precision, device, klass: libraries[klass])
    monkeypatch.setattr(dispatch, "available_classes", lambda precision: ALL)
    monkeypatch.setattr(dispatch, "_current_stream", lambda array: 0)
    monkeypatch.setattr(dispatch, "_copy", copy)
    monkeypatch.setattr(dispatch, "_warned", set())
    return libraries, copies


@pytest.mark.parametrize("order_a", "CF")
@pytest.mark.parametrize("order_b", "CF")
@pytest.mark.parametrize("order_c", "CF")
def test_matmul_runs_every_layout_on_its_library_without_a_copy(order_a, order_b, order_c, host_libraries):
    import gemmgen
    libraries, copies = host_libraries
    rng = np.random.default_rng(1)
    A, B, C = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((37, 53), (53, 29), (37, 29)))
    a, b = HostArray(np.array(A, order=order_a)), HostArray(np.array(B, order=order_b))
    out = HostArray(np.array(C, order=order_c))
    assert gemmgen.matmul(a, b, out, alpha=2.0, beta=0.5) is out
    np.testing.assert_allclose(out.values, 2.0 * (A.astype(np.float64) @ B) + 0.5 * C, rtol=1e-5, atol=1e-5)
    layouts = tuple("row" if o == "C" else "col" for o in (order_a, order_b, order_c))
    klass, swap = ROUTES[layouts]
    assert libraries[klass].calls == [(29, 37, 53) if swap else (37, 29, 53)] and copies == []


def test_matmul_without_the_layouts_libraries_copies_once_and_says_so_once(host_libraries, monkeypatch):
    import gemmgen
    import gemmgen.library.dispatch as dispatch
    libraries, copies = host_libraries
    monkeypatch.setattr(dispatch, "available_classes", lambda precision: BASE)
    rng = np.random.default_rng(2)
    A, B = rng.uniform(-1, 1, (20, 30)).astype(np.float32), rng.uniform(-1, 1, (30, 10)).astype(np.float32)
    a, b = HostArray(np.ascontiguousarray(A)), HostArray(np.ascontiguousarray(B))   # B row-major
    out = HostArray(np.zeros((20, 10), np.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gemmgen.matmul(a, b, out)
        gemmgen.matmul(a, b, out)
    np.testing.assert_allclose(out.values, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)
    assert copies == ["col", "col"]  # B, once per call
    (warning,) = caught
    assert "gemmgen: B of shape (30, 10) with strides (10, 1) is row-major; gemmgen's fp32 kernels read it col-major" in str(warning.message)
    assert libraries[("row", "col")].calls == [(20, 10, 30)] * 2


def test_matmul_copies_an_output_with_no_unit_stride_and_writes_it_back(host_libraries):
    import gemmgen
    _, copies = host_libraries
    rng = np.random.default_rng(3)
    A, B = rng.uniform(-1, 1, (8, 6)).astype(np.float32), rng.uniform(-1, 1, (6, 5)).astype(np.float32)
    wide = rng.uniform(-1, 1, (8, 10)).astype(np.float32)
    before = wide.copy()
    out = HostArray(wide[:, ::2])
    with pytest.warns(RuntimeWarning, match=r"out of shape \(8, 5\) with strides \(10, 2\) has no unit stride"):
        gemmgen.matmul(HostArray(A), HostArray(np.asfortranarray(B)), out, beta=1.0)
    np.testing.assert_allclose(wide[:, ::2], A.astype(np.float64) @ B + before[:, ::2], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(wide[:, 1::2], before[:, 1::2])  # the columns between untouched
    assert copies == ["row"]


def test_batched_arrays_are_one_strided_launch_or_one_gemm_of_stacked_rows(host_libraries):
    import gemmgen
    libraries, copies = host_libraries
    rng = np.random.default_rng(4)
    A = rng.uniform(-1, 1, (3, 9, 6)).astype(np.float32)
    B = rng.uniform(-1, 1, (3, 6, 5)).astype(np.float32)
    W = rng.uniform(-1, 1, (5, 6)).astype(np.float32)       # a shared weight, read transposed
    out = HostArray(np.zeros((3, 9, 5), np.float32))
    gemmgen.matmul(HostArray(A), HostArray(np.ascontiguousarray(B.swapaxes(1, 2)).swapaxes(1, 2)), out)
    np.testing.assert_allclose(out.values, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)
    stacked = HostArray(np.zeros((3, 9, 5), np.float32))
    gemmgen.matmul(HostArray(A), HostArray(W.T), stacked)   # W.T: column-major 6 x 5, serves every batch
    np.testing.assert_allclose(stacked.values, A.astype(np.float64) @ W.T, rtol=1e-5, atol=1e-5)
    base = libraries[("row", "col")]
    assert base.calls[0] == (3, 9, 5, 6) and base.strides[0] == (54, 30, 45)
    assert base.calls[-1] == (27, 5, 6) and copies == []


def test_batched_arrays_broadcast_over_some_dimensions_are_copied_with_the_reason(host_libraries):
    import gemmgen
    _, copies = host_libraries
    rng = np.random.default_rng(5)
    A = rng.uniform(-1, 1, (2, 1, 4, 3)).astype(np.float32)
    B = rng.uniform(-1, 1, (1, 3, 3, 5)).astype(np.float32)
    out = HostArray(np.zeros((2, 3, 4, 5), np.float32))
    with pytest.warns(RuntimeWarning, match=r"A's batches lie at no single stride"):
        gemmgen.matmul(HostArray(A), HostArray(B), out)
    np.testing.assert_allclose(out.values, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)
    assert sorted(copies) == ["col", "row"]


def test_matmul_refuses_what_it_cannot_multiply_before_any_work(host_libraries):
    import gemmgen
    from gemmgen.gpu.runtime import ShapeError
    a = HostArray(np.zeros((4, 5), np.float32))
    with pytest.raises(ShapeError, match="inner sizes differ"):
        gemmgen.matmul(a, HostArray(np.zeros((6, 7), np.float32)))
    with pytest.raises(ShapeError, match="must hold float32"):
        gemmgen.matmul(a, HostArray(np.zeros((5, 7), np.float64)))
    with pytest.raises(ValueError, match="precision 'bf16'"):
        gemmgen.matmul(a, HostArray(np.zeros((5, 7), np.float32)), precision="bf16")
    with pytest.raises(ValueError, match="beta != 0 needs an `out`"):
        gemmgen.matmul(a, HostArray(np.zeros((5, 7), np.float32)), beta=1.0)
    with pytest.raises(ShapeError, match=r"A is not a device array: it is a NumPy array in host \(CPU\) memory; copy it to the GPU first"):
        gemmgen.matmul(np.zeros((4, 5), np.float32), a)


def test_a_layouts_manifest_must_hold_the_layout_its_name_says(tmp_path, monkeypatch):
    import json

    import gemmgen.library.dispatch as dispatch
    monkeypatch.setattr(dispatch, "_libraries_dir", lambda: tmp_path)
    shipped = json.loads((ROOT / "generated" / "fp32.json").read_text())  # a whole manifest, of layout A row, B col
    (tmp_path / "fp32_rr.json").write_text(json.dumps({**shipped, "library": "fp32_rr"}))
    with pytest.raises(ValueError, match=r"fp32_rr.json: library fp32_rr has layout .* not .*'B': 'row'"):
        dispatch.shipped_manifest("fp32", ("row", "row"))
    with pytest.raises(FileNotFoundError, match=r"fp32_cr library .* is missing.*build a library fp32_cr "
                                                r"with layout A col, B row, C row"):
        dispatch.shipped_manifest("fp32", ("col", "row"))
    dispatch.available_classes.cache_clear()
    try:  # fp32_cc: the base library's members built with a column-major A (layouts.RELAID)
        assert dispatch.available_classes("fp32") == frozenset({("row", "col"), ("row", "row"), ("col", "col"),
                                                                ("col", "col", "col")})
        assert dispatch.available_classes("tf32") == frozenset({("row", "col"), ("col", "col"), ("col", "col", "col")})
    finally:
        dispatch.available_classes.cache_clear()


def test_the_relaid_runtime_builds_the_base_members_with_a_column_major_a(monkeypatch):
    """fp32_cc: the shipped fp32 members, chosen by the same models, planned with layout A col, B col;
    the decode member (which reads A along K only) is never chosen there."""
    import gemmgen.library.dispatch as dispatch
    import gemmgen.library.runtime as library_runtime
    from fake_device import INFO
    monkeypatch.setattr(library_runtime, "device_info", lambda ordinal=0: INFO)
    monkeypatch.setattr(dispatch, "_runtimes", {})
    base = dispatch.library("fp32", 0)
    relaid = dispatch.library("fp32", 0, ("col", "col"))
    assert relaid.name == "fp32_cc" and relaid.layouts == {"A": "col", "B": "col", "C": "row"}
    assert list(relaid.left_out) == [i for i, m in enumerate(base.manifest.members) if m.decode] != []
    assert "reads A and B along K" in next(iter(relaid.left_out.values()))
    for index, (plan, base_plan) in enumerate(zip(relaid.plans, base.plans)):
        if index in relaid.left_out:  # not built in the class's layouts: never chosen
            continue
        assert (plan.spec["layout.A"], plan.spec["layout.B"]) == ("col", "col")
        assert (plan.BM, plan.BN, plan.stages, plan.spec["schedule"]) == (base_plan.BM, base_plan.BN,
                                                                           base_plan.stages, base_plan.spec["schedule"])
        assert (base_plan.spec["layout.A"], base_plan.spec["layout.B"]) == ("row", "col")
    for M, N, K in ((4096, 4096, 4096), (2048, 8192, 2048), (127, 4099, 1023), (1, 4096, 4096), (16, 11008, 4096)):
        chosen = relaid.choose(M, N, K, M, K, N, (0, 0, 0))
        assert chosen not in relaid.left_out
        if M > 16:  # where the decode member does not compete, the same member as the base library's
            assert chosen == base.choose(M, N, K, K, K, N, (0, 0, 0))


def test_the_tf32_relaid_runtime_reads_a_column_major_a_into_registers_and_leaves_out_what_cannot(monkeypatch):
    """tf32_cc: the tf32 members built with a column-major A, which their consumers read from its
    MN-major tile into registers; left out (never chosen) are the decode member, clusters (they
    multicast K-major slices), 128-row ping-pong tiles (two slabs' fragments do not fit) and a cp.async
    member (none since the tf32 library keeps no truncating member), which would copy A 4 bytes at a
    time, far from the speed its timings promise."""
    import gemmgen.library.dispatch as dispatch
    import gemmgen.library.runtime as library_runtime
    from fake_device import INFO
    monkeypatch.setattr(library_runtime, "device_info", lambda ordinal=0: INFO)
    monkeypatch.setattr(dispatch, "_runtimes", {})
    base = dispatch.library("tf32", 0)
    relaid = dispatch.library("tf32", 0, ("col", "col"))
    assert relaid.name == "tf32_cc"
    expected = {}
    for index, (member, plan) in enumerate(zip(base.manifest.members, base.plans)):
        if member.decode:
            expected[index] = "reads A and B along K"
        elif plan.cluster_m * plan.cluster_n > 1:
            expected[index] = "multicast slices of K-major"
        elif plan.pingpong and plan.BM > 64:
            expected[index] = "two slabs' fragments"
        elif getattr(plan.mainloop, "copies", False):
            expected[index] = "4 bytes at a time"
    assert sorted(relaid.left_out) == sorted(expected) and len(expected) >= 3
    for index, words in expected.items():
        assert words in relaid.left_out[index]
    for index, plan in enumerate(relaid.plans):
        if index not in relaid.left_out and plan.mainloop.tma:
            assert plan.mainloop.math_template == "wgmma_tf32_a.cuh.j2" and plan.mainloop.a_from_registers
            # stored through shared memory, whatever the base member's store (from registers this
            # path ran 0.79-0.87x its A row speed on an H100, staged 0.99-1.02x), but for split K's
            # atomic sums (through a workspace, the last slice stores the tile: staged too)
            staged = plan.split_k == 1 or plan.scheduler.split_by == "workspace"
            assert plan.epilogue.tma_store == staged == plan.spec["epilogue.staged"]
            # and with 4 stages at least, whose loads cover the fragments' reads (a 3-stage member
            # ran 0.90x its 4-stage twin at 4096^3 relaid on an H100)
            base_plan = base.plans[index]
            assert (plan.BM, plan.BN, plan.stages, plan.spec["schedule"]) == (
                base_plan.BM, base_plan.BN, max(base_plan.stages, 4), base_plan.spec["schedule"])
    # a 3-stage TMA member is made 4, whether or not the shipped library keeps one
    from gemmgen.library.runtime import _relaid
    from gemmgen.plan import make_plan
    tma = next(p for i, p in enumerate(base.plans) if p.mainloop.tma and i not in relaid.left_out)
    three = make_plan(tma.spec.with_values(stages=3))
    assert three.stages == 3 and _relaid(three, ("col", "col"), "row", "cc").stages == 4
    assert any(not base.plans[i].spec["epilogue.staged"] and base.plans[i].mainloop.tma
               for i in range(len(base.plans)) if i not in relaid.left_out)  # a direct store made staged
    for M, N, K in ((4096, 4096, 4096), (2048, 8192, 2048), (127, 4099, 1023), (16, 11008, 4096), (8192, 128, 8192)):
        assert relaid.choose(M, N, K, M, K, N, (0, 0, 0)) not in relaid.left_out


def test_the_relaid_runtime_writing_c_column_major(monkeypatch):
    """fp32_cc_ccol: the same members with layout A col, B col, C col."""
    import gemmgen.library.dispatch as dispatch
    import gemmgen.library.runtime as library_runtime
    from fake_device import INFO
    monkeypatch.setattr(library_runtime, "device_info", lambda ordinal=0: INFO)
    monkeypatch.setattr(dispatch, "_runtimes", {})
    relaid = dispatch.library("fp32", 0, ("col", "col", "col"))
    assert relaid.name == "fp32_cc_ccol" and relaid.layouts == {"A": "col", "B": "col", "C": "col"}
    for index, plan in enumerate(relaid.plans):
        if index not in relaid.left_out:
            assert plan.c_layout == "col" and plan.spec.name.endswith("_ccc")


def test_matmul_takes_vectors_as_numpy_matmul_does(host_libraries):
    """A 1-D A is a row, a 1-D B a column, and that dimension is in neither the result nor `out`."""
    import gemmgen
    from gemmgen.gpu.runtime import ShapeError
    libraries, copies = host_libraries
    rng = np.random.default_rng(6)
    W, x, y = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((40, 30), (30,), (40,)))
    out = HostArray(np.full(40, np.nan, np.float32))
    assert gemmgen.matmul(HostArray(W), HostArray(x), out) is out       # W @ x: one row, C^T = x^T W^T
    np.testing.assert_allclose(out.values, W.astype(np.float64) @ x, rtol=1e-5, atol=1e-5)
    assert libraries[("row", "col")].calls == [(1, 40, 30)] and copies == []
    row = HostArray(np.zeros(30, np.float32))
    gemmgen.matmul(HostArray(y), HostArray(W), row, alpha=2.0)          # y @ W: a row times a matrix
    np.testing.assert_allclose(row.values, 2.0 * (y.astype(np.float64) @ W), rtol=1e-5, atol=1e-5)
    dot = HostArray(np.zeros((), np.float32))
    gemmgen.matmul(HostArray(x), HostArray(x), dot)                     # x @ x: one value
    np.testing.assert_allclose(dot.values, x.astype(np.float64) @ x, rtol=1e-5)
    with pytest.raises(ShapeError, match="vectors, matrices or batches"):
        gemmgen.matmul(HostArray(np.float32(1.0) * np.ones((), np.float32)), HostArray(x))
