"""A library's members with a fused epilogue: the member a library chooses for a call, compiled once
more with `bias col` and an activation in its store, and without beta (what gemmgen.linear runs:
C is written, never read).

A shipped library's .cu holds its members as they were tuned, with `alpha beta` epilogues. A call
that wants act(A @ B + bias) runs the member the library predicts fastest for its shape and
alignment (the same choice as gemmgen.matmul), planned again with the epilogue settings and compiled
with NVRTC on first use (cubins are cached on disk), then launched through the C ABI: the bias
vector comes after ldc. The epilogue costs the store a read of N floats and a few instructions per
value, where PyTorch's F.linear + activation re-read and re-write C once for the bias and once for
the activation.

A member whose plan cannot take the epilogue (a nonlinear activation after split K's atomic sums,
which the libraries choose for decode-sized M) is passed over for the fastest member that can; where
none can, and for a matrix-vector product (the decode member's, in FP32), the caller runs the plain
member and the epilogue as separate passes.
"""

from __future__ import annotations

from dataclasses import replace

from ..gpu.runtime import Kernel
from ..language.errors import SpecError
from ..plan import Plan, make_plan
from ..plan.parts.epilogue import ACTIVATIONS
from .dispatch import LibraryRuntime
from .selection import alignment_class, choose, short_sum_call, vector_call


def check_activation(activation: str | None) -> str:
    """The activation's name ("none" for None), or a ValueError listing the names there are."""
    name = "none" if activation is None else activation
    if not isinstance(name, str) or name not in ACTIVATIONS:
        choices = ", ".join(repr(n) for n in ACTIVATIONS if n != "none")
        raise ValueError(f"activation {activation!r}: one of {choices}, or None")
    return name


def fused_name(member: str, bias: bool, activation: str) -> str:
    """The kernel name of a member with an epilogue, e.g. fp32_3_bias_gelu."""
    return member + ("_bias" if bias else "") + ("" if activation == "none" else f"_{activation}")


class FusedMembers:
    """One library on one device, its members compiled with epilogues on demand, each kept."""

    def __init__(self, runtime: LibraryRuntime):
        self.runtime = runtime
        self._kernels: dict[tuple[int, bool, str], Kernel | None] = {}
        self._plans: dict[tuple[int, bool, str], Plan | None] = {}

    def plan(self, index: int, bias: bool, activation: str) -> Plan | None:
        """The plan of member `index` with `bias col` (when `bias`) and `activation` in its
        epilogue; None where the member cannot take that epilogue (an activation after split K's
        atomic sums)."""
        key = (index, bias, activation)
        if key not in self._plans:
            plan = self.runtime.kernel_plan(index)
            # Without beta: gemmgen.linear never reads C, and beta's code (C's old values added per
            # accumulator, in a second copy of the activation) made the kernel 40% larger (SASS of
            # tf32_5 with bias + GELU: 6624 -> 3760 instructions). H100, 027873b, fused / plain at the
            # shapes below: fp32 0.984 -> 1.005, 0.960 -> 0.984, 0.941 -> 0.962; tf32 0.950 -> 0.956,
            # 0.961 -> 0.970, 0.927 -> 0.947 (benchmarks/epilogue/2026-11-26-h100-027873b-no-beta.json).
            spec = replace(plan.spec.with_values(bias="col" if bias else "none", activation=activation,
                                                 epilogue_beta=False),
                           name=fused_name(plan.spec.name, bias, activation))
            self._plans[key] = None
            # Which store and schedule the fused kernel takes, from the library's chosen members with
            # bias + GELU on each (benchmarks/epilogue_schedules.py, H100, 9a9f9a0; 4096^3,
            # 2048x5632x2048, 8192x1024x1024, x the plain member):
            # - a TF32 wgmma member stores through shared memory (staged) on the persistent walk,
            #   the next tile's loads overlapping the epilogue: 0.983 / 0.944 / 0.923, against
            #   0.964 / 0.935 / 0.896 staged data-parallel and 0.973 / 0.934 / 0.880 persistent direct;
            # - a 3xTF32 member keeps its own store: its consumers' registers are spent on the
            #   split operands, and the staged store cost more (persistent 0.972 / 0.967 / 0.945
            #   direct, 0.865 / 0.865 / 0.833 staged).
            staged = []
            if plan.consumers and spec["math"] == "tf32":
                variant = spec.with_values(epilogue_staged=True)
                if spec["schedule"] == "data-parallel":
                    staged.append(variant.with_values(schedule="persistent"))
                staged.append(variant)
            for candidate in staged + [spec]:
                try:
                    self._plans[key] = make_plan(candidate)
                    break
                except SpecError:
                    continue
        return self._plans[key]

    def choose(self, M: int, N: int, K: int, lda: int, ldb: int, ldc: int, pointers: tuple[int, int, int],
               bias: bool, activation: str) -> int:
        """The member for the call: the library's choice where it can take the epilogue, else the
        one predicted fastest among those that can (a split-K member, chosen for decode-sized M,
        cannot apply an activation to its atomic sums). A matrix-vector product, and in the fp32 library
        a call of few rows (short_sum_call), keeps the library's decode member, whose sums are as
        short as cuBLAS's there, and the caller runs the epilogue as passes."""
        runtime = self.runtime
        index = runtime.choose(M, N, K, lda, ldb, ldc, pointers)
        if (self.plan(index, bias, activation) is not None or not runtime.tuned_gpu
                or vector_call(runtime.candidates, M, N) or short_sum_call(runtime.candidates, M, N, runtime.exact_rows)):
            return index
        able = [i for i in range(len(runtime.candidates)) if self.plan(i, bias, activation) is not None]
        if not able:
            return index  # none can: the caller runs the epilogue as passes
        best = choose([runtime.candidates[i] for i in able], M, N, K, alignment_class(lda, ldb, ldc, pointers),
                      runtime.info.sm_count, beta_used=False, sm90a=runtime.info.compute_capability == (9, 0))
        return able[best]

    def kernel(self, index: int, bias: bool, activation: str) -> Kernel | None:
        """That plan's Kernel on the library's device (compiled on first use), or None."""
        key = (index, bias, activation)
        if key not in self._kernels:
            fused = self.plan(index, bias, activation)
            self._kernels[key] = None if fused is None else Kernel(fused, device=self.runtime.device)
        return self._kernels[key]


_fused: dict[int, FusedMembers] = {}


def fused_members(runtime: LibraryRuntime) -> FusedMembers:
    """The FusedMembers of a library runtime (one per runtime, kept for the process)."""
    members = _fused.get(id(runtime))
    if members is None or members.runtime is not runtime:
        members = _fused[id(runtime)] = FusedMembers(runtime)
    return members
