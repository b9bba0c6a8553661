"""The epilogue part: how the accumulators reach C (CUTLASS's collective epilogue).

- Direct: each thread writes its own values, C_VEC floats at a time where the call is aligned
  (under split K, one atomicAdd per float);
- Staged (`epilogue ... staged` on the tiled kernels): the block's C tile is assembled in shared
  memory, then stored along C's contiguous dimension;
- TmaStore (`epilogue ... staged` on the TMA-fed wgmma kernels): each consumer warp writes its rows
  into swizzled shared boxes that TMA stores.

Each computes C = act(alpha * scale ⊙ acc + beta * C + bias) per element (beta: `epilogue alpha
beta`; bias and scale: `bias row|col`, `scale row|col`, vectors indexed by C's row or column; `act`:
`activation NAME`, an entry of ACTIVATIONS), and may fuse the min-reduce (`reduce min N`: the N
smallest entries of C). Epilogue.value writes that expression for every store; the vectors are
kernel parameters after the main ones and launcher arguments after ldc.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...language.spec import Spec
from ..arch import Arch
from .launch import REDUCE_CLEAR, REDUCE_FINISH, Helper, Parameter, TensorMapSpec


@dataclass(frozen=True)
class Activation:
    """An elementwise function applied to each value of C as it is stored: adding one is one entry
    of ACTIVATIONS (every epilogue applies it through Epilogue.value)."""

    name: str
    cuda: str            # C expression of the value {x} (a float), e.g. "fmaxf({x}, 0.0f)": the definition,
    #                      which references read in double (gpu/epilogue_inputs.py) and kernels run unless `body`
    derivative: str      # C expression of d act / dx at {x}, for the backward pass of autograd
    words: str           # what a spec writes for it, as SpecErrors list the choices
    body: str = ""       # where `cuda` is slow: the statements of its device function of x, which kernels run

    def apply(self, x: str) -> str:
        """The C expression of act(x): `cuda` itself where it names x once, else a call of its
        device function (`definition`), so that x is computed once and the code stays readable."""
        if self.cuda == "{x}":
            return x
        if self.cuda.count("{x}") == 1 and not self.body:
            return self.cuda.replace("{x}", f"({x})")
        return f"{self.function}({x})"

    @property
    def function(self) -> str:
        return f"activation_{self.name}"

    @property
    def definition(self) -> str | None:
        """The device function that `apply` calls (None where it writes the expression inline)."""
        if self.body:
            return (f"// {self.words}\n__device__ __forceinline__ float {self.function}(float x)\n{{\n"
                    f"{self.body.rstrip()}\n}}")
        if self.cuda.count("{x}") <= 1:
            return None
        return (f"// {self.words}\n__device__ __forceinline__ float {self.function}(float x) "
                f"{{ return {self.cuda.replace('{x}', 'x')}; }}")


# GELU's kernels run x Phi(x) = max(x, 0) - |x| Phi(-|x|), with Phi(-t) = 0.5 erfc(t / sqrt 2) =
# 2^(t p(t) - 1) for t = |x| <= 13.5 (and 0 past it, where it is below float's smallest normal):
# one polynomial, one exp2 and no branch, where erff chooses between two polynomials per value (its
# code computes both coefficients and selects, 30 instructions a value against 14 here). p, of
# degree 8, is a weighted least-squares fit of log2(0.5 erfc(t / sqrt 2)) on [0, 13.5], weighted by
# Phi(-t) |x|: the error of what is stored. Float32's result lies within 1.4 |x| 2^-24 of GELU (the
# erff form: 1.7 with erf exactly rounded), before ex2.approx's own 2 ulp (tests/test_fused_epilogue.py).
# Under the 2^-24 |x| scale both round alike: 1 + erf(x / sqrt 2) cancels for negative x as
# Phi(-|x|)'s small values do not. max.NaN keeps a NaN input NaN; +inf gives inf, -inf -0.
GELU_POLYNOMIAL = (-1.15110576, -0.459201127, -0.0525226183, 0.0071065356, -0.000170264146,
                   -0.000175313791, 3.93898044e-05, -3.60091553e-06, 1.1801481e-07)
GELU_TAIL = 13.5


def _gelu_body() -> str:
    horner = "".join(f"    p = fmaf(p, t, {c!r}f);\n" for c in reversed(GELU_POLYNOMIAL[:-1]))
    return (f"    const float t = fminf(fabsf(x), {GELU_TAIL!r}f);  // |x|, to where Phi(-|x|) is 0 in float\n"
            f"    float p = {GELU_POLYNOMIAL[-1]!r}f;\n{horner}"
            "    float tail, relu;  // Phi(-|x|) = 2^(t p(t) - 1); max(x, 0), NaN for NaN\n"
            "    asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(tail) : \"f\"(fmaf(t, p, -1.0f)));\n"
            "    asm(\"max.NaN.f32 %0, %1, 0f00000000;\" : \"=f\"(relu) : \"f\"(x));\n"
            "    return fmaf(-t, tail, relu);  // x Phi(x) = max(x, 0) - |x| Phi(-|x|)")


ACTIVATIONS = {
    "none": Activation("none", "{x}", "1.0f", "no activation"),
    "relu": Activation("relu", "fmaxf({x}, 0.0f)", "({x} > 0.0f ? 1.0f : 0.0f)", "relu"),
    # GELU, the erf form: x * Phi(x), Phi the normal distribution's CDF.
    "gelu": Activation("gelu", "0.5f * {x} * (1.0f + erff({x} * 0.70710678f))",
                       "(0.5f * (1.0f + erff({x} * 0.70710678f)) + {x} * 0.39894228f * expf(-0.5f * {x} * {x}))",
                       "gelu (x * Phi(x), with erf)", _gelu_body()),
    # GELU's tanh approximation: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
    "gelu_tanh": Activation("gelu_tanh", "0.5f * {x} * (1.0f + tanhf(0.79788456f * ({x} + 0.044715f * {x} * {x} * {x})))",
                            "(0.5f * (1.0f + tanhf(0.79788456f * ({x} + 0.044715f * {x} * {x} * {x}))) + 0.5f * {x} * 0.79788456f"
                            " * (1.0f + 0.134145f * {x} * {x}) * (1.0f - tanhf(0.79788456f * ({x} + 0.044715f * {x} * {x} * {x}))"
                            " * tanhf(0.79788456f * ({x} + 0.044715f * {x} * {x} * {x}))))", "gelu_tanh (GELU's tanh approximation)"),
    # SiLU (swish): x * sigmoid(x).
    "silu": Activation("silu", "{x} / (1.0f + expf(-{x}))",
                       "(1.0f / (1.0f + expf(-{x})) * (1.0f + {x} * (1.0f - 1.0f / (1.0f + expf(-{x})))))",
                       "silu (x * sigmoid(x))"),
}

# Where a vector of the epilogue is indexed: by C's row (M floats) or its column (N floats).
VECTOR_LENGTH = {"row": "M", "col": "N"}
VECTOR_INDEX = {"row": "i", "col": "j"}


@dataclass(frozen=True)
class Output:
    """Index expressions for C, relative to the block's tile."""

    layout: str

    @property
    def tile_origin(self) -> str:
        """Offset of the block's tile in C: in its batch's C (batch_index * strideC floats on)."""
        if self.layout == "row":
            return "batch_index * strideC + (long long)block_m0 * ldc + block_n0"
        return "batch_index * strideC + (long long)block_n0 * ldc + block_m0"

    @property
    def c_extent(self) -> str:
        """C expression: the floats C spans, its first element to one past its last (0: empty)."""
        rows, length = ("M", "N") if self.layout == "row" else ("N", "M")
        return f"(M > 0 && N > 0 ? (long long)({rows} - 1) * ldc + {length} : 0)"

    def extent(self, M: int, N: int, ldc: int) -> int:
        """c_extent in Python."""
        rows, length = (M, N) if self.layout == "row" else (N, M)
        return (rows - 1) * ldc + length if M > 0 and N > 0 else 0

    def index(self, m: str, n: str) -> str:
        if self.layout == "row":
            return f"(long long)({m}) * ldc + ({n})"
        return f"(long long)({n}) * ldc + ({m})"

    def position(self, outer: str, inner: str) -> tuple[str, str]:
        """C expressions (m, n) in C of the tile's element at (outer, inner): along C's rows and its
        contiguous dimension."""
        if self.layout == "row":
            return f"block_m0 + {outer}", f"block_n0 + {inner}"
        return f"block_m0 + {inner}", f"block_n0 + {outer}"


@dataclass(frozen=True)
class Epilogue:
    """Direct: each thread stores its accumulators to C, c_vector floats at a time when aligned."""

    c_layout: str             # "row" or "col"
    beta: bool                # C = alpha * A*B + beta * C (else alpha * A*B, C not read)
    c_vector: int = 1         # floats per store of C in the aligned variant
    reduce_count: int = 0     # the fused min-reduce: how many smallest entries of C (0: none)
    atomic: bool = False      # split K: each slice adds its product into C, one atomicAdd per float
    activation: Activation = field(default=ACTIVATIONS["none"])
    bias: str = "none"        # "row": C += bias[i] (M floats), "col": C += bias[j] (N floats), or "none"
    scale: str = "none"       # "row" or "col": alpha times scale[i] or scale[j] (M or N floats), or "none"

    staged: ClassVar[bool] = False     # assembled in shared memory (the tiled kernels' staged store)
    tma_store: ClassVar[bool] = False  # boxes stored by TMA (the TMA-fed wgmma kernels' staged store)
    template: ClassVar[str] = "epilogue_direct.cuh.j2"  # its store macros
    store: ClassVar[str] = "registers"   # how C is written: "registers", "staged" or "tma" (explain replays it)
    store_parameters: ClassVar[tuple[Parameter, ...]] = ()   # what the store adds to the kernel's parameters

    # --- the vectors (bias, scale) and the activation
    @property
    def vectors(self) -> tuple[tuple[str, str], ...]:
        """(name, "row" or "col") of each vector the epilogue reads, in the order of the ABI: bias,
        then scale."""
        return tuple((name, by) for name, by in (("bias", self.bias), ("scale", self.scale)) if by != "none")

    @property
    def fused(self) -> bool:
        """Whether the epilogue does more than alpha and beta: a vector or an activation."""
        return bool(self.vectors) or self.activation.name != "none"

    @property
    def parameters(self) -> tuple[Parameter, ...]:
        """Kernel parameters after the main ones: the store's (a TMA store's map of C), then the vectors."""
        return self.store_parameters + tuple(Parameter(name, "v") for name, _ in self.vectors)

    def _element(self, by: str, m: str, n: str, clamp: bool) -> str:
        """C expression of the vector `by`'s element at C's (m, n); clamped inside C where the store
        computes values past C's edge (a TMA box), which it then drops."""
        index = m if self.vectors_by[by] == "row" else n
        if clamp:
            index = f"min({index}, {VECTOR_LENGTH[self.vectors_by[by]]} - 1)"
        return f"{by}[{index}]"

    @property
    def device_functions(self) -> tuple[str, ...]:
        """Device code the kernel defines after its helpers: the activation's function, if it has one."""
        definition = self.activation.definition
        return (definition,) if definition else ()

    @property
    def vectors_by(self) -> dict[str, str]:
        return dict(self.vectors)

    @property
    def c(self) -> Output:
        return Output(self.c_layout)

    @property
    def vector_constants(self) -> list[tuple[str, int, str]]:
        """(name, value, comment) of the constants the direct store adds to a tiled kernel."""
        return [] if self.atomic else [("C_VEC", self.c_vector, "floats per C access when aligned")]

    @property
    def helpers(self) -> tuple[str, ...]:
        """Device code the kernel includes after common.cuh.j2."""
        return ("reduce_min.cuh.j2",) if self.reduce_count else ()

    # --- the launch: the min-reduce's kernels (its list cleared before, written out after, also for
    # an empty C), a TMA store's map of C, and what stores C where the call is aligned
    aligned_store: ClassVar[str] = "vector"

    @property
    def launches(self) -> tuple[Helper, ...]:
        if not self.reduce_count:
            return ()
        return (Helper("reduce_clear", REDUCE_CLEAR, 32, empty_too=True),
                Helper("reduce_finish", REDUCE_FINISH, 32, before=False, empty_too=True))

    def tensor_maps(self, M: int, N: int, ldc: int, aligned: bool, batch: int = 1,
                    stride_c: int = 0) -> tuple[list[TensorMapSpec], dict]:
        """The maps a call encodes for C (of `batch` products, stride_c apart), and the values fixed
        in place of those it does not."""
        return [], {}

    @property
    def fusion_template(self) -> str:
        """What the stores do besides storing: keep the smallest values of C (`reduce min N`), or nothing."""
        return "fusion_reduce_min.cuh.j2" if self.reduce_count else "fusion_none.cuh.j2"

    # --- rows: what the header of the .cu and explain say about the epilogue, and what its aligned
    # variant needs of a call
    needs_label: ClassVar[str] = "vector path needs"

    def rows(self) -> list[tuple[str, str]]:
        return [("epilogue", self.expression)]

    def fusion_rows(self) -> list[tuple[str, str]]:
        if not self.reduce_count:
            return []
        return [("fused reduction", f"{self.reduce_count} smallest entries of C with row and column")]

    def vector_requirements(self) -> list[tuple[str, str | None, str, int]]:
        """(pointer, size, leading dimension, vector) that the aligned variant's stores need divisible."""
        if self.c_vector == 1:
            return []
        return [("C", "N" if self.c_layout == "row" else "M", "ldc", self.c_vector)]

    # --- the C ABI: what the entry point takes after ldc, and what its header says of it
    @property
    def abi_parameters(self) -> str:
        vectors = "".join(f"const float *{name}, " for name, _ in self.vectors)
        return vectors + ("float *smallest_values, int *smallest_rows, int *smallest_cols, " if self.reduce_count else "")

    @property
    def abi_arguments(self) -> str:
        vectors = "".join(f"{name}, " for name, _ in self.vectors)
        return vectors + ("smallest_values, smallest_rows, smallest_cols, " if self.reduce_count else "")

    @property
    def launcher_parameters(self) -> str:
        """The vectors in the launcher's definition, after ldc (a fused reduction's outputs follow)."""
        return "".join(f" const float* {name}," for name, _ in self.vectors)

    @property
    def pointer_checks(self) -> tuple[tuple[str, str], ...]:
        """(C condition that refuses the call, comment) of each vector, checked with C's pointer."""
        return tuple((f"!{name}", f"{name}: {VECTOR_LENGTH[by]} floats, {name}[{VECTOR_INDEX[by]}] for "
                                  f"{'row i' if by == 'row' else 'column j'} of C")
                     for name, by in self.vectors)

    @property
    def contract(self) -> str:
        """What the C header says the entry point computes (for row i and column j of C)."""
        if not self.fused:
            return "C = alpha * A*B + beta * C"
        return f"{self.formula} for row i and column j of C,"

    @property
    def abi_notes(self) -> list[str]:
        notes = [f"{name}: a device array of {VECTOR_LENGTH[by]} floats, {name}[{VECTOR_INDEX[by]}] for "
                 f"{'row i' if by == 'row' else 'column j'} of C; a null {name} is cudaErrorInvalidValue."
                 for name, by in self.vectors]
        if not self.reduce_count:
            return notes
        n = self.reduce_count
        return notes + [f"smallest_values, smallest_rows, smallest_cols: device arrays of {n} floats, ints "
                        f"and ints that receive the {n} smallest entries of C with their row and column. "
                        "The running list lives in the kernel's device memory: two calls must not run "
                        "at the same time on different streams."]

    @property
    def formula(self) -> str:
        """What the epilogue computes, in words: C = act(alpha * scale[i] * (A*B) + beta * C + bias[j])."""
        return f"C = {self.expression}"

    @property
    def expression(self) -> str:
        """The right-hand side of `formula`."""
        product = "alpha * A*B"
        if self.scale != "none":
            product = f"alpha * scale[{VECTOR_INDEX[self.scale]}] * (A*B)"
        value = f"{product} + beta * C" if self.beta else product
        if self.bias != "none":
            value += f" + bias[{VECTOR_INDEX[self.bias]}]"
        if self.activation.name != "none":
            value = f"{self.activation.name}({value})"
        return value

    def explain_rows(self, shapes: tuple[tuple[int, int], ...] = ((2048, 5632), (4096, 4096))) -> list[tuple[str, str]]:
        """`gemmgen explain`'s rows: the formula, and the traffic of C that separate passes (a bias
        add, an activation: each reads C and writes it back) would cost at some shapes of C."""
        rows = [("computes", self.formula)]
        passes = [word for word, done in (("scale", self.scale != "none"), ("bias", self.bias != "none"),
                                          (self.activation.name, self.activation.name != "none")) if done]
        if not passes:
            return rows + [("traffic saved", "none: no bias, scale or activation to fuse")]
        per_element = 8 * len(passes)  # each pass reads and writes a float of C
        sizes = ", ".join(f"{per_element * M * N / 1e6:.1f} MB at {M}x{N}" for M, N in shapes)
        count = "1 pass" if len(passes) == 1 else f"{len(passes)} passes"
        return rows + [("traffic saved", f"{count} over C not run ({', '.join(passes)}), each reading and "
                                         f"writing C: {per_element} bytes per element of C ({sizes})")]

    @property
    def beta_term(self) -> str:
        """What C's formula adds to alpha * A * B, in the launcher's comment (with the fused epilogue's
        whole formula)."""
        term = "+ beta * C" if self.beta else ""
        return f"{term} (with the fused epilogue: {self.formula} at row i, column j)" if self.fused else term

    @property
    def beta_refusal(self) -> str:
        """The launcher's refusal of a beta that this epilogue cannot apply, in its comment."""
        return "" if self.beta else ", beta != 0 (this kernel has no beta)"

    def value(self, product: str, old: str | None, read_c: str = "read_c", m: str = "m", n: str = "n",
              clamp: bool = False) -> str:
        """C expression of one stored value from `product` (alpha * A*B's) and `old` (C's, read where
        `read_c` holds; None: C is not read) at C's row m and column n (read the
        vectors there; `clamp`: m or n may lie past C's edge)."""
        if self.scale != "none":
            product = f"{product} * {self._element('scale', m, n, clamp)}"
        with_c = self.beta and old is not None
        value = f"{read_c} ? {product} + beta * {old} : {product}" if with_c else product
        if self.bias != "none":
            value = f"({value}) + {self._element('bias', m, n, clamp)}" if with_c else \
                f"{value} + {self._element('bias', m, n, clamp)}"
        return self.activation.apply(value)

    # --- a fused direct or TMA store: where C's old values are not read, every value computed in
    # registers before the first store (epilogue_fused.cuh.j2)
    @property
    def registers_template(self) -> str:
        """What the direct and TMA stores do before storing: a fused epilogue's pass over the
        accumulators, which leaves each final value in acc where C is not read (split K's atomic
        adds excepted: they add partial products), or nothing."""
        return "epilogue_fused.cuh.j2" if self.fused and not self.atomic else "epilogue_unfused.cuh.j2"

    def stored(self, product: str, old: str, read_c: str, m: str, n: str, acc: str, clamp: bool = False) -> str:
        """C expression of the value a store writes for the accumulator `acc` (`product` is alpha
        times it) at C's (m, n): `value`'s where the epilogue is not fused; a fused one's is already
        in acc where C is not read (epilogue_fused.cuh.j2's pass), else computed here."""
        if not self.fused or self.atomic:
            return self.value(product, old, read_c, m, n, clamp)
        if not self.beta:
            return acc
        return f"read_c ? {self.value(product, old, read_c, m, n, clamp)} : {acc}"

    def added(self, product: str, m: str, n: str) -> str:
        """C expression that a slice of split K adds into C at (m, n) by atomicAdd: its product
        (scaled), and the bias once, by the first slice."""
        if self.scale != "none":
            product = f"{product} * {self._element('scale', m, n, False)}"
        if self.bias != "none":
            product += f" + (blockIdx.y == 0 ? {self._element('bias', m, n, False)} : 0.0f)"
        return product


@dataclass(frozen=True)
class Staged(Epilogue):
    """The block's C tile assembled in shared memory (reusing the operands'), then stored along C's
    contiguous dimension, so each warp's stores (and beta's loads) are adjacent."""

    c_stage_rows: int = 0     # rows along C's outer (non-contiguous) dimension
    c_stage_cols: int = 0
    c_stage_ld: int = 0       # floats between rows of the staged tile (cols + 4)
    c_stage_vec: int = 1      # floats per coalesced access of the staged store

    staged: ClassVar[bool] = True
    template: ClassVar[str] = "epilogue_staged.cuh.j2"
    store: ClassVar[str] = "staged"

    @property
    def vector_constants(self) -> list[tuple[str, int, str]]:
        return []

    @property
    def smem_bytes(self) -> int:
        return 4 * self.c_stage_rows * self.c_stage_ld


C_STORE_BUFFERS = 2  # boxes per consumer warp, so one is written while TMA reads the other


@dataclass(frozen=True)
class TmaStore(Epilogue):
    """Each consumer warp writes its 16 rows of the C tile into shared boxes of c_box_outer x
    c_box_inner floats (inner: along C's contiguous dimension), c_buffers of them in turn, and TMA
    stores each box."""

    c_box_outer: int = 0
    c_box_inner: int = 0
    c_buffers: int = C_STORE_BUFFERS

    tma_store: ClassVar[bool] = True
    template: ClassVar[str] = "epilogue_tma.cuh.j2"
    store: ClassVar[str] = "tma"
    store_parameters: ClassVar[tuple[Parameter, ...]] = (Parameter("map_c", "t"),)
    aligned_store: ClassVar[str] = "TMA"
    needs_label: ClassVar[str] = "TMA store path needs"

    def rows(self) -> list[tuple[str, str]]:
        ((label, formula),) = super().rows()
        return [(label, f"{formula}; through shared memory: each consumer warp writes its 16 rows in boxes of "
                        f"{self.c_box_outer} x {self.c_box_inner} floats ({self.c_buffers} in turn, "
                        f"{self.c_box_swizzle}-byte swizzle), each stored by TMA")]

    def vector_requirements(self) -> list[tuple[str, str | None, str, int]]:
        # TMA stores boxes of C: 16-byte aligned base and row stride, and C's contiguous extent a
        # multiple of 4 floats: a box past C's edge is clipped there only to 16 bytes, so with
        # N = 13 and ldc = 16 it wrote columns 13-15 (measured on an H100).
        return super().vector_requirements() + [("C", "N" if self.c_layout == "row" else "M", "ldc", 4)]

    def tensor_maps(self, M: int, N: int, ldc: int, aligned: bool, batch: int = 1,
                    stride_c: int = 0) -> tuple[list[TensorMapSpec], dict]:
        """Where aligned, C's boxes (else C is stored from registers and the map is not read)."""
        if not aligned:
            return [], {"map_c": bytes(128)}
        inner, outer = (N, M) if self.c_layout == "row" else (M, N)
        return [TensorMapSpec("map_c", "C", inner, outer, ldc, self.c_box_inner, self.c_box_outer,
                              self.c_box_swizzle, 0, batch, stride_c)], {}

    def smem_bytes(self, consumers: int) -> int:
        """Shared bytes of every consumer warp's boxes."""
        return consumers * 4 * self.c_buffers * 4 * self.c_box_outer * self.c_box_inner

    @property
    def c_box_swizzle(self) -> int:
        """Bytes of TMA's swizzle for the staged C boxes: one box row (32, 64 or 128)."""
        return 4 * self.c_box_inner

    def c_box_index(self, outer: str, inner: str) -> str:
        """C expression: float offset of (outer, inner) in a staged C box as TMA's swizzle of one
        box row lays it out: 16-byte chunk c of each 128 bytes goes to c ^ (bits 7.. of the address),
        so a warp's writes of a fragment spread over the banks."""
        shift = {32: 0, 16: 1, 8: 2}[self.c_box_inner]  # box rows per 128 bytes: 2 ** shift
        mask = self.c_box_swizzle // 16 - 1
        outer = outer if outer.isidentifier() else f"({outer})"
        row = outer if shift == 0 else f"({outer} >> {shift})"
        return f"{outer} * {self.c_box_inner} + ({inner} ^ (({row} & {mask}) << 2))"


def _largest_vector(run: int) -> int:
    return 4 if run % 4 == 0 else 2 if run % 2 == 0 else 1


def atomic_split(spec: Spec) -> bool:
    """Whether every slice of split K adds into C with atomics (`split N`, N > 1; under `split N
    cluster` block 0 stores C as an unsplit kernel does, and the others' adds are the schedule's)."""
    return spec["split"] > 1 and spec["split.by"] == "atomic"


def direct_vector(c_layout: str, TM: int, TN: int, m_step: int, split_k: int) -> int:
    """Floats per store of C: a thread's run along C's contiguous dimension, none where a lane's
    accumulator rows are m_step apart (no two adjacent along M) or under split K (one atomicAdd
    per float)."""
    if split_k > 1 or (c_layout == "col" and m_step > 1):
        return 1
    return _largest_vector(TN if c_layout == "row" else TM)


def tiled_epilogue(spec: Spec, BM: int, BN: int, TM: int, TN: int, m_step: int) -> Epilogue:
    """The epilogue of a tiled kernel (checked by check_on_tiles)."""
    c_layout = spec["layout.C"]
    common = dict(c_layout=c_layout, beta=spec["epilogue.beta"], reduce_count=spec["reduce.count"],
                  c_vector=direct_vector(c_layout, TM, TN, m_step, spec["split"]), atomic=atomic_split(spec),
                  **fused_settings(spec))
    if not spec["epilogue.staged"]:
        return Epilogue(**common)
    # The staged C tile runs along C's contiguous dimension and reuses the operands' shared memory.
    rows, cols = (BM, BN) if c_layout == "row" else (BN, BM)
    return Staged(**common, c_stage_rows=rows, c_stage_cols=cols, c_stage_ld=cols + 4,
                  c_stage_vec=_largest_vector(cols))


def warpgroup_epilogue(spec: Spec, BN: int) -> Epilogue:
    """The epilogue of a wgmma kernel (checked by check_tma_store)."""
    c_layout, beta, fused = spec["layout.C"], spec["epilogue.beta"], fused_settings(spec)
    if not spec["epilogue.staged"]:
        atomic = atomic_split(spec)
        return Epilogue(c_layout=c_layout, beta=beta, c_vector=direct_vector(c_layout, 2, 2, 8, 2 if atomic else 1),
                        atomic=atomic, **fused)
    # Each consumer warp owns 16 rows of the tile, so its boxes are 16 rows by up to 32 columns of
    # C; along C's contiguous dimension a box row is 32, 64 or 128 bytes, which is the swizzle TMA
    # applies (and what spreads the warp's writes over the banks).
    box_n = next(width for width in (32, 16, 8) if BN % width == 0)
    outer, inner = (16, box_n) if c_layout == "row" else (box_n, 16)
    return TmaStore(c_layout=c_layout, beta=beta, c_box_outer=outer, c_box_inner=inner, **fused)


def fused_settings(spec: Spec) -> dict:
    """The bias, scale and activation a spec asks for (every path takes them), checked: a known
    activation, and none but the identity where split K sums slices into C after their epilogues."""
    name = spec["activation"]
    if name not in ACTIVATIONS:
        raise spec.error("activation", f"unknown activation '{name}'",
                         "; ".join(f"{key}: {entry.words}" for key, entry in ACTIVATIONS.items()))
    if name != "none" and spec["split"] > 1 and spec["split.by"] != "workspace":
        raise spec.error(("activation", "split"), f"split K adds each slice's partial product into C with "
                         f"atomicAdd, after that slice's epilogue; {name} of a partial sum is not {name} "
                         "of the whole", f"split 1 with activation {name}; on the TMA-fed wgmma kernels also "
                         f"split {spec['split']} workspace or schedule stream-k, which sum a tile's slices "
                         "before its epilogue; or no activation with split")
    return dict(bias=spec["bias"], scale=spec["scale"], activation=ACTIVATIONS[name])


# --- the rules, each raised at its setting --------------------------------------------------------

def check_on_tiles(spec: Spec, uses_shared: bool) -> None:
    """The tiled kernels: the fused reduction needs each entry of C final in its block, and the
    staged store needs shared memory and whole tiles."""
    split_k = spec["split"]
    if split_k > 1 and spec["reduce.count"]:
        raise spec.error("split", "a split K adds partial products into C after the blocks finish, "
                         "but the fused reduction needs each entry of C final inside its block",
                         "split 1 with reduce, or no reduce")
    staged = spec["epilogue.staged"]
    if staged and not uses_shared:
        raise spec.error("epilogue.staged", "a staged epilogue assembles C in shared memory, which "
                         "'shared off' turns off", "epilogue alpha beta, or shared memory on")
    if staged and split_k > 1:
        raise spec.error("epilogue.staged", "split K adds partial tiles into C one float at a time; "
                         "staging whole tiles through shared memory gains nothing there",
                         "split 1 with staged, or an epilogue without staged")


def check_staged_fits(spec: Spec, arch: Arch, BM: int, BN: int, smem_bytes: int) -> None:
    if smem_bytes > arch.smem_per_block:
        raise spec.error("epilogue.staged", f"the staged {BM} x {BN} C tile needs {smem_bytes} "
                         f"bytes of shared memory; a block on {arch.name} gets at most "
                         f"{arch.smem_per_block}", "a smaller block tile, or no staged epilogue")


def check_no_reduce(spec: Spec) -> None:
    """The wgmma kernels fuse no reduction."""
    if spec["reduce.count"]:
        raise spec.error("reduce.count", "the wgmma path has no fused reduction",
                         "target sm_90 (mma.sync) for fused reduction")


def check_tma_store(spec: Spec, tma: bool) -> None:
    """The wgmma kernels' staged store goes through TMA, which whole tiles need."""
    if not spec["epilogue.staged"]:
        return
    if not tma:
        raise spec.error("epilogue.staged", "the wgmma staged epilogue writes C through shared memory and "
                         "stores it with TMA; this kernel's loader warpgroups have no TMA",
                         "stages N tma, or an epilogue without staged")
    if spec["split"] > 1 and spec["split.by"] != "workspace":
        raise spec.error(("epilogue.staged", "split"), "split K adds each slice's product into C with "
                         "atomics; a TMA store would overwrite the other slices' sums",
                         f"split {spec['split']} workspace (the last slice stores the sum), split 1 with "
                         "staged, or an epilogue without staged")
