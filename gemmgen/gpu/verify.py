"""Check a kernel against a float64 reference over a matrix of shapes, on the GPU.

Each case draws fresh random inputs in [-1, 1], poisons the output (NaN where beta is 0, so an
unwritten element fails) and the guard cells around it (a NaN with a marker payload, checked
bit for bit afterwards), places the matrices at the case's leading dimensions and pointer offset,
and compares with alpha * A @ B + beta * C computed in float64. The tolerance grows with K and
follows the kernel's math mode (`math tf32` rounds its inputs to TF32 first).

`measure_accuracy` records how far a kernel's result is from the float64 product beside cuBLAS's
FP32 and TF32 results on the same inputs: relative errors, not pass or fail.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from math import inf, log2, sqrt
from typing import Any

import numpy as np

from .baseline import cublas_gemm
from .epilogue_inputs import epilogue_reference, epilogue_vectors, vector_pointers
from .runtime import Kernel, synchronize

GUARD_BITS = 0x7FC0DEAD          # a quiet NaN whose payload marks untouched guard cells
TOLERANCE_FACTOR = 16.0           # x sqrt(K) x unit round-off x (|alpha| |A||B| + |beta| |C|)
UNIT_ROUNDOFF = {                 # of the rounding that dominates each math mode's error
    "simt": 2.0 ** -24,           # FP32 products and sums
    # tf32 rounds A and B to 10 stored mantissa bits (u = 2^-11) before the tensor cores multiply;
    # that input rounding, not the FP32 accumulation, bounds the error, so it takes FP32's place.
    "tf32": 2.0 ** -11,
    "3xtf32": 2.0 ** -24,         # big + small TF32 parts carry FP32's 24 bits
}


def tolerance(scale, K: int, math: str = "simt"):
    """Largest accepted |C - reference| per element, where scale = |alpha| |A||B| + |beta| |C|
    and math is the kernel's math mode: the rounding error grows about like sqrt(K) when the
    summands' signs are random."""
    return TOLERANCE_FACTOR * sqrt(K + 1) * _unit_roundoff(math) * scale + 1e-30


def tolerance_rule(math: str = "simt") -> str:
    """The rule `tolerance` applies to a math mode, in words, for headers and reports."""
    exponent = -round(log2(_unit_roundoff(math)))
    return (f"math {math}: |C - C64| <= {TOLERANCE_FACTOR:g} sqrt(K+1) 2^-{exponent} "
            "(|alpha| |A||B| + |beta| |C|) per element")


def _unit_roundoff(math: str) -> float:
    if math not in UNIT_ROUNDOFF:
        raise ValueError(f"unknown math mode {math!r}: one of {', '.join(UNIT_ROUNDOFF)}")
    return UNIT_ROUNDOFF[math]


@dataclass(frozen=True)
class Case:
    """One call: sizes, scalars, extra leading-dimension padding and a pointer offset in floats."""

    M: int
    N: int
    K: int
    alpha: float = 1.0
    beta: float = 0.0
    pad: int = 0
    offset: int = 0
    batch: int = 1  # strided matrices of M x N x K, one after another (tuning times batched shapes)

    def __str__(self) -> str:
        text = f"{self.M}x{self.N}x{self.K}" + (f" batch {self.batch}" if self.batch != 1 else "")
        if (self.alpha, self.beta) != (1.0, 0.0):
            text += f" a={self.alpha:g} b={self.beta:g}"
        if self.pad:
            text += f" ld+{self.pad}"
        if self.offset:
            text += f" ptr+{self.offset}"
        return text


_CASE = re.compile(r"^(\d+)x(\d+)x(\d+)((?:,[a-z]+=-?[\d.e+-]+)*)$")


def parse_case(text: str) -> Case:
    """'MxNxK' with optional ',alpha=..,beta=..,pad=..,offset=..' (e.g. '127x4099x1023,beta=0.5')."""
    match = _CASE.match(text.strip())
    if not match:
        raise ValueError(f"bad shape {text!r}: expected MxNxK[,alpha=A][,beta=B][,pad=P][,offset=O], "
                         "e.g. 4096x4096x4096 or 127x131x137,beta=0.5,pad=3")
    M, N, K = (int(match.group(i)) for i in (1, 2, 3))
    options: dict[str, Any] = {}
    for item in filter(None, match.group(4).split(",")):
        key, value = item.split("=")
        if key not in ("alpha", "beta", "pad", "offset"):
            raise ValueError(f"bad shape option {key!r} in {text!r}: alpha, beta, pad or offset")
        options[key] = float(value) if key in ("alpha", "beta") else int(value)
    return Case(M, N, K, **options)


# The default matrix: degenerate and tiny sizes, primes, sizes below one tile, sizes that are no
# multiple of the vector width, alpha/beta other than (1, 0), padded leading dimensions,
# misaligned pointers (forcing the scalar path) and the seeds' 4092^3.
DEFAULT_CASES = (
    Case(1, 1, 1),
    Case(1, 1, 1, alpha=-0.5, beta=2.0),
    Case(5, 7, 3),
    Case(0, 5, 5),
    Case(5, 5, 0, beta=0.75),
    Case(17, 29, 31, alpha=1.5, beta=-0.75),
    Case(33, 65, 17, offset=1),
    Case(127, 131, 137, pad=3),
    Case(128, 128, 128),
    Case(257, 255, 253, alpha=0.5, beta=0.5, pad=5, offset=1),
    Case(512, 256, 1024, beta=1.0, pad=4),
    Case(127, 4099, 1023),
    Case(1024, 1024, 1024, alpha=2.0, beta=-1.0),
    Case(4092, 4092, 4092, beta=0.5),
)
QUICK_CASES = tuple(c for c in DEFAULT_CASES if c.M * c.N * c.K < 3e8)


@dataclass
class CaseResult:
    case: Case
    ok: bool
    worst_ratio: float = 0.0         # max error / tolerance (<= 1 passes)
    max_relative_error: float = 0.0  # max |C - ref| / max |ref|
    message: str = ""
    seconds: float = 0.0


@dataclass
class CheckReport:
    kernel: str
    results: list[CaseResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if not r.ok]


def _cupy():
    import cupy
    return cupy


def place_matrix(cp, values, layout: str, pad: int, offset: int):
    """A device buffer holding `values` (rows x cols) in `layout`, guard cells all around it."""
    rows, cols = values.shape
    lines, length = (rows, cols) if layout == "row" else (cols, rows)
    ld = max(1, length) + pad
    size = offset + max(lines, 1) * ld + 8
    buffer = cp.full(size, GUARD_BITS, dtype=cp.uint32).view(cp.float32)
    if rows and cols:
        body = buffer[offset: offset + lines * ld].reshape(lines, ld)[:, :length]
        body[...] = cp.asarray(values if layout == "row" else values.T)
    return buffer, ld


def matrix_view(cp, buffer, rows: int, cols: int, layout: str, ld: int, offset: int):
    lines, length = (rows, cols) if layout == "row" else (cols, rows)
    body = buffer[offset: offset + lines * ld].reshape(lines, ld)[:, :length]
    return body if layout == "row" else body.T


class Problem:
    """Random inputs and the float64 reference of one case, shared by every kernel checked on it."""

    def __init__(self, case: Case, rng: np.random.Generator):
        cp = _cupy()
        self.case = case
        M, N, K = case.M, case.N, case.K
        seed = int(rng.integers(1 << 31))
        generator = cp.random.default_rng(seed)
        self.A = generator.uniform(-1, 1, (M, K), dtype=cp.float64).astype(cp.float32)
        self.B = generator.uniform(-1, 1, (K, N), dtype=cp.float64).astype(cp.float32)
        self.C = generator.uniform(-1, 1, (M, N), dtype=cp.float64).astype(cp.float32)
        A64, B64, C64 = (x.astype(cp.float64) for x in (self.A, self.B, self.C))
        self.reference = case.alpha * (A64 @ B64)
        self.scale = abs(case.alpha) * (cp.abs(A64) @ cp.abs(B64))
        if case.beta != 0.0:
            self.reference += case.beta * C64
            self.scale += abs(case.beta) * cp.abs(C64)


def check_case(kernel: Kernel, problem: Problem) -> CaseResult:
    cp = _cupy()
    case, plan = problem.case, kernel.plan
    started = time.perf_counter()
    layout = {name: plan.spec[f"layout.{name}"] for name in "ABC"}
    a_buf, lda = place_matrix(cp, problem.A, layout["A"], case.pad, case.offset)
    b_buf, ldb = place_matrix(cp, problem.B, layout["B"], case.pad, case.offset)
    # C starts as its input when beta is used, else poisoned with NaN: every element must be written.
    c_values = problem.C if case.beta != 0.0 else cp.full((case.M, case.N), cp.nan, dtype=cp.float32)
    c_buf, ldc = place_matrix(cp, c_values, layout["C"], case.pad, case.offset)
    guard_before = c_buf.view(cp.uint32).copy()
    region_mask = cp.zeros(c_buf.size, dtype=cp.bool_)
    matrix_view(cp, region_mask, case.M, case.N, layout["C"], ldc, case.offset)[...] = True

    smallest = None
    if plan.reduce_count:
        smallest = (cp.zeros(plan.reduce_count, cp.float32), cp.zeros(plan.reduce_count, cp.int32),
                    cp.zeros(plan.reduce_count, cp.int32))
    address = lambda buf: buf.data.ptr + 4 * case.offset  # noqa: E731
    reference, scale = problem.reference, problem.scale
    vectors = epilogue_vectors(cp, plan, case.M, case.N, seed=case.M * 7 + case.N)
    if plan.epilogue.fused:  # bias, scale, activation: the value the store must write
        reference, scale = epilogue_reference(cp, plan, problem.A, problem.B, problem.C, case.alpha, case.beta,
                                              vectors)
    kernel.launch(case.M, case.N, case.K, case.alpha, address(a_buf), lda, address(b_buf), ldb,
                  case.beta, address(c_buf), ldc,
                  smallest=tuple(x.data.ptr for x in smallest) if smallest else None, **vector_pointers(vectors))
    synchronize()

    result = CaseResult(case, True)
    touched = (c_buf.view(cp.uint32) != guard_before) & ~region_mask
    if bool(touched.any()):
        where = int(cp.argmax(touched))
        result.ok = False
        result.message = f"wrote outside C's {case.M} x {case.N} region (buffer element {where})"
    if case.M and case.N:
        out = matrix_view(cp, c_buf, case.M, case.N, layout["C"], ldc, case.offset).astype(cp.float64)
        error = cp.abs(out - reference)
        allowed = tolerance(scale, case.K, plan.spec["math"])
        ratio = error / allowed
        bad = ~(ratio <= 1.0)  # NaN compares false, so NaN never passes
        ratio = cp.where(cp.isnan(ratio), cp.inf, ratio)
        worst = int(cp.argmax(ratio))
        i, j = divmod(worst, case.N)
        result.worst_ratio = float(ratio.ravel()[worst])
        peak = float(cp.abs(reference).max()) or 1.0
        result.max_relative_error = float(cp.nan_to_num(error, nan=cp.inf).max()) / peak
        if bool(bad.any()) and result.ok:
            result.ok = False
            result.message = (f"{int(bad.sum())} element(s) wrong; worst C[{i}, {j}] = "
                              f"{float(out[i, j])!r}, expected {float(reference[i, j])!r} "
                              f"(error {float(error[i, j]):.3g} > tolerance {float(allowed[i, j]):.3g})")
        if smallest is not None and result.ok:
            result.message = _check_smallest(cp, out.astype(cp.float32), smallest, plan.reduce_count)
            result.ok = not result.message
    result.seconds = time.perf_counter() - started
    return result


def _check_smallest(cp, out, smallest, count: int) -> str:
    """The fused reduction must report the `count` smallest entries of the C it wrote, in order."""
    flat = out.ravel()
    order = cp.lexsort(cp.stack([cp.arange(flat.size), flat]))[:count]
    values, rows, cols = (x.get() for x in smallest)
    for r, position in enumerate(order.get()):
        i, j = divmod(int(position), out.shape[1])
        if (rows[r], cols[r]) != (i, j) or values[r] != float(flat[position]):
            return (f"smallest entry #{r + 1}: kernel says C[{rows[r]}, {cols[r]}] = {values[r]!r}, "
                    f"expected C[{i}, {j}] = {float(flat[position])!r}")
    return ""


def check(kernel: Kernel, cases=DEFAULT_CASES, *, seed: int | None = None,
          problems: dict | None = None, progress=None) -> CheckReport:
    """Run every case; problems (inputs and references) may be shared between kernels."""
    rng = np.random.default_rng(seed)
    problems = problems if problems is not None else {}
    report = CheckReport(kernel.name)
    for case in cases:
        if case not in problems:
            problems[case] = Problem(case, rng)
        report.results.append(check_case(kernel, problems[case]))
        if progress:
            progress(case)
    return report


def relative_errors(cp, out, reference) -> tuple[float, float]:
    """(||out - ref||_F / ||ref||_F, max |out - ref| / max |ref|); a NaN counts as infinitely wrong."""
    if not reference.size:
        return 0.0, 0.0
    error = out.astype(cp.float64) - reference
    error = cp.where(cp.isnan(error), cp.inf, error)
    return (_ratio(float(cp.linalg.norm(error)), float(cp.linalg.norm(reference))),
            _ratio(float(cp.abs(error).max()), float(cp.abs(reference).max())))


def _ratio(error: float, size: float) -> float:
    return error / size if size else (0.0 if error == 0.0 else inf)


@dataclass
class Accuracy:
    """How close a kernel, cuBLAS FP32 and cuBLAS TF32 come to the float64 product on the same
    inputs. rel: ||C - C64||_F / ||C64||_F; max rel: max |C - C64| / max |C64|."""

    kernel: str
    shape: str
    math: str
    rel_error: float
    max_rel_error: float
    cublas_fp32_rel_error: float
    cublas_fp32_max_rel_error: float
    cublas_tf32_rel_error: float
    cublas_tf32_max_rel_error: float

    @property
    def ratio_to_fp32(self) -> float:
        """The kernel's relative error in units of cuBLAS FP32's (1 = as accurate)."""
        return _ratio(self.rel_error, self.cublas_fp32_rel_error)

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio_to_fp32": self.ratio_to_fp32}


def accuracy_on(kernel: Kernel, case: Case, A, B, C) -> Accuracy:
    """The Accuracy of `kernel` on the float32 device arrays A (M x K), B (K x N) and C (M x N),
    placed in the kernel's layouts at the case's padding and offset, for alpha A@B + beta C.
    cuBLAS runs on the same placed inputs through the launcher's ABI. A kernel with a fused
    epilogue is measured against its own float64 value (epilogue_inputs.py), cuBLAS's plain GEMM
    against the plain one."""
    cp = _cupy()
    plan = kernel.plan
    layouts = {name: plan.spec[f"layout.{name}"] for name in "ABC"}
    reference = case.alpha * (A.astype(cp.float64) @ B.astype(cp.float64))
    if case.beta != 0.0:
        reference += case.beta * C.astype(cp.float64)
    vectors = epilogue_vectors(cp, plan, case.M, case.N, seed=case.M * 7 + case.N)
    ours_reference = reference
    if plan.epilogue.fused:
        ours_reference, _ = epilogue_reference(cp, plan, A, B, C, case.alpha, case.beta, vectors)
    a_buf, lda = place_matrix(cp, A, layouts["A"], case.pad, case.offset)
    b_buf, ldb = place_matrix(cp, B, layouts["B"], case.pad, case.offset)
    address = lambda buf: buf.data.ptr + 4 * case.offset  # noqa: E731
    smallest, smallest_arrays = None, None  # the arrays stay referenced while the kernel writes them
    if plan.reduce_count:
        smallest_arrays = [cp.zeros(plan.reduce_count, dtype) for dtype in (cp.float32, cp.int32, cp.int32)]
        smallest = tuple(x.data.ptr for x in smallest_arrays)

    def errors(multiply, reference=reference) -> tuple[float, float]:
        # A fresh C each time: its input when beta is used, else NaN, so unwritten elements count.
        c_values = C if case.beta != 0.0 else cp.full((case.M, case.N), cp.nan, dtype=cp.float32)
        c_buf, ldc = place_matrix(cp, c_values, layouts["C"], case.pad, case.offset)
        multiply(address(c_buf), ldc)
        synchronize()
        out = matrix_view(cp, c_buf, case.M, case.N, layouts["C"], ldc, case.offset)
        return relative_errors(cp, out, reference)

    operands = (case.M, case.N, case.K, case.alpha, address(a_buf), lda, address(b_buf), ldb, case.beta)
    mine = errors(lambda c, ldc: kernel.launch(*operands, c, ldc, smallest=smallest, **vector_pointers(vectors)),
                  ours_reference)
    fp32 = errors(lambda c, ldc: cublas_gemm(*operands, c, ldc, layouts, tf32=False))
    tf32 = errors(lambda c, ldc: cublas_gemm(*operands, c, ldc, layouts, tf32=True))
    return Accuracy(kernel.name, str(case), plan.spec["math"], *mine, *fp32, *tf32)


def measure_accuracy(kernel: Kernel, case: Case, *, seed: int | None = 0) -> Accuracy:
    """The Accuracy of `kernel` at `case` on random inputs, uniform in [-1, 1]."""
    cp = _cupy()
    generator = cp.random.default_rng(seed)
    A, B, C = (generator.uniform(-1, 1, shape, dtype=cp.float64).astype(cp.float32)
               for shape in ((case.M, case.K), (case.K, case.N), (case.M, case.N)))
    return accuracy_on(kernel, case, A, B, C)
