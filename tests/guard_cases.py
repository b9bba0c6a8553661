"""The guard-cell case matrix (issue 25): which kernels are checked for writes outside C, at which
calls, and where each matrix lies in its buffer. Pure Python: the CPU test (test_guard_cases.py)
checks the matrix itself, the GPU test (test_gpu_guard.py) runs it.

- Targets: every concrete kernel of specs/ (its emitted generated/<name>.cu), every member of the
  shipped libraries (generated/<precision>.json and .cu) and each library's own entry point.
- Cases: the held-out calls that found the staged TMA-store kernels writing outside C, and a sweep
  whose M, N and K take every remainder modulo the target's tile (BM, BN, BK) and modulo 4, under
  six placements of A, B and C (leading dimensions past the width, multiples of 4 and not; 16-byte
  aligned pointers and pointers one float off), each with beta 0 and beta != 0.
- Placements: each matrix is a view into a wider buffer with guard cells before it, between its
  width and its leading dimension, and past its end (more than one tile of C's lines), so that a
  store to any cell a tile could reach lands on a guard cell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import gcd, lcm
from pathlib import Path

from conftest import GENERATED_DIR, load_shipped_specs

ALPHA = 0.75
BETA = -0.5
HEAD = 16  # guard floats before every matrix: 64 bytes, so an offset of 0 stays 16-byte aligned

# The held-out calls of issue 25 (C row-major, alpha 0.75, beta -0.5 or 0): M, N, K and ldc.
HELD_OUT = ((1, 1, 1, 4), (7, 13, 5, 16), (33, 65, 17, 68), (333, 129, 4097, 132), (333, 129, 4097, 136),
            (4096, 1, 257, 4), (255, 257, 1, 260))
HELD_OUT_BETAS = (BETA, 0.0)


def aligned_past(width: int) -> int:
    """The smallest multiple of 4 past `width` by at least one float (at least 4 past a multiple)."""
    return (width + 3) // 4 * 4 + 4


# How a leading dimension is chosen from the width of its matrix: always past the width.
LD_RULES = {
    "aligned": aligned_past,         # a multiple of 4: TMA and vector paths where the rest allows
    "+3": lambda width: width + 3,   # a multiple of 4 only when width = 1 mod 4 (issue 25's ldc)
    "+4": lambda width: width + 4,   # a multiple of 4 exactly when the width is
    "+7": lambda width: width + 7,
}

# Placements of the sweep: (name, leading-dimension rule of A, B, C, pointer offset in floats of A, B, C).
MODES = (
    ("aligned", ("aligned", "aligned", "aligned"), (0, 0, 0)),
    ("ldc+3", ("aligned", "aligned", "+3"), (0, 0, 0)),
    ("ldc+7", ("aligned", "aligned", "+7"), (0, 0, 0)),
    ("lda+3 ldb+7", ("+3", "+7", "+4"), (0, 0, 0)),
    ("all+1 float", ("+4", "+4", "+4"), (1, 1, 1)),
    ("C+1 float", ("aligned", "aligned", "aligned"), (0, 0, 1)),
)
SWEEP_BLOCK = 4  # consecutive sweep cases sharing a placement and beta: every remainder mod 4 of M, N
SWEEP_MIN = SWEEP_BLOCK * len(MODES) * 2  # so that each placement meets each beta


@dataclass(frozen=True)
class GuardCase:
    """One call: sizes, scalars, leading dimensions and pointer offsets (floats) of A, B and C."""

    M: int
    N: int
    K: int
    alpha: float
    beta: float
    lda: int
    ldb: int
    ldc: int
    offsets: tuple[int, int, int] = (0, 0, 0)
    mode: str = "held-out"

    @property
    def lds(self) -> dict[str, int]:
        return {"A": self.lda, "B": self.ldb, "C": self.ldc}

    @property
    def offset(self) -> dict[str, int]:
        return dict(zip("ABC", self.offsets))

    @property
    def id(self) -> str:
        return f"{self.M}x{self.N}x{self.K}-ldc{self.ldc}-beta{self.beta:g}"

    def __str__(self) -> str:
        text = (f"{self.M}x{self.N}x{self.K} alpha={self.alpha:g} beta={self.beta:g} "
                f"lda={self.lda} ldb={self.ldb} ldc={self.ldc}")
        if any(self.offsets):
            text += " offsets A+{} B+{} C+{}".format(*self.offsets)
        return f"{text} ({self.mode})"


@dataclass(frozen=True)
class Target:
    """Something a user calls: a shipped kernel, a library member, or a library's entry point."""

    name: str
    kind: str                     # "kernel", "member" or "library"
    plans: tuple                  # the kernel's plan; a library's member plans
    source: Path                  # the .cu a user compiles
    library: str = ""             # the library a member or entry point belongs to
    index: int = 0                # a member's place in its library
    members: tuple[str, ...] = field(default=())  # a library's member names, in order

    @property
    def plan(self):
        return self.plans[0]

    @property
    def layouts(self) -> dict[str, str]:
        spec = self.plan.spec
        return {"A": spec["layout.A"], "B": spec["layout.B"], "C": self.plan.c_layout}

    @property
    def tile(self) -> tuple[int, int, int]:
        """BM, BN, BK; for an entry point, the least common multiple of its members' (so that its
        remainders are every member's)."""
        return (lcm(*(p.BM for p in self.plans)), lcm(*(p.BN for p in self.plans)),
                lcm(*(p.BK for p in self.plans)))

    @property
    def beta(self) -> bool:
        """Whether it takes beta != 0 (a library: whether some member does)."""
        return any(p.beta for p in self.plans)

    @property
    def math(self) -> str:
        """The math mode whose tolerance applies: the least precise of its plans'."""
        from gemmgen.gpu.verify import UNIT_ROUNDOFF
        return max((p.spec["math"] for p in self.plans), key=lambda m: UNIT_ROUNDOFF[m])

    def runs_on(self, capability: tuple[int, int]) -> str:
        """Why it cannot run on a GPU of this compute capability ("" when it can). An entry point
        runs its portable member anywhere from sm_80 on."""
        if self.kind == "library":
            return "" if capability >= (8, 0) else "the libraries need sm_80 or newer"
        arch = self.plan.arch
        major, minor = arch.compute_capability
        exact = arch.name.endswith("a")
        fits = capability == (major, minor) if exact else (capability[0] == major and capability[1] >= minor)
        return "" if fits else (f"{self.name} is built for {arch.name}; this GPU is "
                                f"sm_{capability[0]}{capability[1]}")


def _library_targets(precision: str) -> list[Target]:
    from gemmgen.library.manifest import Manifest
    manifest_path = GENERATED_DIR / f"{precision}.json"
    if not manifest_path.is_file():
        return []
    manifest = Manifest.read(manifest_path)
    plans = tuple(manifest.plans())
    names = tuple(m.name for m in manifest.members)
    source = GENERATED_DIR / f"{precision}.cu"
    members = [Target(name, "member", (plan,), source, precision, i, names)
               for i, (name, plan) in enumerate(zip(names, plans))]
    return members + [Target(f"library_{precision}", "library", plans, source, precision, 0, names)]


def targets() -> list[Target]:
    """Every shipped kernel, every member of each shipped library, and each library's entry point."""
    from gemmgen.plan import make_plan
    found = [Target(spec.name, "kernel", (make_plan(spec),), GENERATED_DIR / f"{spec.name}.cu")
             for spec in load_shipped_specs()]
    for precision in ("fp32", "tf32"):
        found += _library_targets(precision)
    return found


# --- the cases --------------------------------------------------------------------------------

def width(name: str, layout: str, M: int, N: int, K: int) -> int:
    """Floats of a matrix's contiguous dimension (what its leading dimension must cover)."""
    rows, cols = {"A": (M, K), "B": (K, N), "C": (M, N)}[name]
    return cols if layout == "row" else rows


def lines(name: str, layout: str, M: int, N: int, K: int) -> int:
    """How many leading-dimension strides a matrix spans."""
    rows, cols = {"A": (M, K), "B": (K, N), "C": (M, N)}[name]
    return rows if layout == "row" else cols


def held_out(target: Target) -> list[GuardCase]:
    """Issue 25's held-out calls: A and B at leading dimensions past their width that TMA can take,
    C at the issue's ldc (ldc - N floats past its width)."""
    layouts = target.layouts
    cases = []
    for M, N, K, ldc in HELD_OUT:
        lda = aligned_past(width("A", layouts["A"], M, N, K))
        ldb = aligned_past(width("B", layouts["B"], M, N, K))
        ldc = width("C", layouts["C"], M, N, K) + (ldc - N)
        for beta in HELD_OUT_BETAS if target.beta else (0.0,):
            cases.append(GuardCase(M, N, K, ALPHA, beta, lda, ldb, ldc))
    return cases


def _coprime_stride(modulus: int, start: int) -> int:
    stride = start
    while gcd(stride, modulus) != 1:
        stride += 2
    return stride


def sweep(target: Target) -> list[GuardCase]:
    """Case i: M = i, N = s i + 3 and K = t i + 1 modulo their tile (and 4), s and t coprime to it,
    so that any run of that many consecutive cases takes every remainder; blocks of 4 consecutive
    cases share a placement and beta, so that each placement and beta meets every remainder mod 4
    of M and N. Whole tiles (0 to 3 of K, 0 or 1 of M and N) are added in turn, and two K = 0
    calls (C = beta C) close it."""
    BM, BN, BK = target.tile
    lm, ln, lk = lcm(BM, 4), lcm(BN, 4), lcm(BK, 4)
    sn, sk = _coprime_stride(ln, 5), _coprime_stride(lk, 3)
    count = max(lm, ln, lk, SWEEP_MIN)
    layouts = target.layouts
    cases = []
    for i in range(count):
        M = i % lm + lm * ((i // 4) % 2) or lm
        N = (sn * i + 3) % ln + ln * ((i // 8) % 2) or ln
        K = (sk * i + 1) % lk + lk * ((i // 3) % 4) or lk
        block = i // SWEEP_BLOCK
        mode, rules, offsets = MODES[block % len(MODES)]
        beta = BETA if target.beta and (block // len(MODES)) % 2 == 0 else 0.0
        lda, ldb, ldc = (LD_RULES[rule](width(name, layouts[name], M, N, K))
                         for name, rule in zip("ABC", rules))
        cases.append(GuardCase(M, N, K, ALPHA, beta, lda, ldb, ldc, offsets, mode))
    M, N = lm + 1, ln + 3
    for beta in (BETA, 0.0) if target.beta else (0.0,):
        lda, ldb, ldc = (aligned_past(width(name, layouts[name], M, N, 0)) for name in "ABC")
        cases.append(GuardCase(M, N, 0, ALPHA, beta, lda, ldb, ldc, (0, 0, 0), "K = 0"))
    return cases


# --- where a matrix lies in its buffer ----------------------------------------------------------

@dataclass(frozen=True)
class Placement:
    """A matrix in a buffer of `size` floats: `lines` strides of `ld` from `start`, `length` of each
    used; every other float is a guard cell."""

    lines: int
    length: int
    ld: int
    start: int
    size: int

    @property
    def end(self) -> int:
        """One past the last float of the matrix's last stride (its slack included)."""
        return self.start + self.lines * self.ld


def placements(target: Target, case: GuardCase) -> dict[str, Placement]:
    """A, B and C of a case in their buffers. After each matrix come more than a tile of C's lines
    (ld floats each) and a tile's width of guard cells: a tile stored past C's edge, in either
    direction, lands on them."""
    layouts = target.layouts
    BM, BN, _ = target.tile
    reach = max(BM, BN)
    found = {}
    for name in "ABC":
        n_lines = lines(name, layouts[name], case.M, case.N, case.K)
        length = width(name, layouts[name], case.M, case.N, case.K)
        ld = case.lds[name]
        start = HEAD + case.offset[name]
        tail = (reach + 1) * ld + reach
        found[name] = Placement(n_lines, length, ld, start, start + n_lines * ld + tail)
    return found


def pointer(placement: Placement, base: int = 0) -> int:
    """The matrix's address in a buffer at `base` (CuPy's allocations are 256-byte aligned)."""
    return base + 4 * placement.start


def describe_cell(placement: Placement, index: int, name: str = "C") -> str:
    """Where buffer float `index` lies relative to a matrix, in words."""
    if index < placement.start:
        return f"{placement.start - index} float(s) before {name}'s first element"
    line, position = divmod(index - placement.start, placement.ld)
    where = (f"past {name}'s last line" if line >= placement.lines
             else f"between {name}'s width {placement.length} and its ld {placement.ld}")
    return f"line {line}, float {position} of {name} ({where})"
