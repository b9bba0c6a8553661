"""A shipped library on one device: the member chosen per call (selection.py), compiled with NVRTC
on first use and launched by raw device addresses, as the library's C ABI takes them. An unaligned
call that pays to pad (padding.py) runs the aligned member on padded copies of its operands.
dispatch.py resolves each gemmgen.matmul call to one of these."""

from __future__ import annotations

import warnings
from dataclasses import replace
from functools import lru_cache
from typing import Any

from ..gpu.compile import compile_all
from ..gpu.launch import CudaError
from ..gpu.runtime import Kernel, device_info, stream_handle
from ..language.errors import SpecError
from ..plan import make_plan
from .layouts import c_layout_of, library_name
from .manifest import Manifest
from .padding import PaddedLaunch, padding
from .selection import alignment_class, choose, choose_padded, short_sum_rows


class LibraryRuntime:
    """A library manifest ready to run on one device: choose a member per call, launch it. With
    `relaid` (an operand class of layouts.RELAID), the base library's members built in that class's
    layouts, chosen by the same models; a member that cannot be built so, or would run markedly
    slower so (Mainloop.slow_layouts), is never chosen."""

    def __init__(self, manifest: Manifest, device: int = 0, relaid: tuple[str, ...] | None = None):
        self.manifest = manifest
        self.name = manifest.library if relaid is None else library_name(manifest.precision, relaid)
        self.device = device
        self.info = device_info(device)
        self.plans = list(manifest.plans())
        self.candidates = list(manifest.candidates())
        self.layouts = manifest.layout
        self.exact_rows = short_sum_rows(manifest.precision)  # calls of these rows: FFMA members only
        self.left_out: dict[int, str] = {}  # relaid: members that cannot be built so, and why
        if relaid is not None:
            self.layouts = {"A": relaid[0], "B": relaid[1], "C": c_layout_of(relaid)}
            suffix = "".join(layout[0] for layout in self.layouts.values())
            for index, plan in enumerate(self.plans):
                try:
                    self.plans[index] = _relaid(plan, relaid, self.layouts["C"], suffix)
                    why = self.plans[index].mainloop.slow_layouts(self.plans[index])
                except SpecError as exc:
                    why = exc.message
                if why:  # its base timings do not hold here
                    self.left_out[index] = why
                    self.candidates[index] = replace(self.candidates[index], models={})
        tuned = manifest.device.compute_capability
        self.tuned_gpu = list(self.info.compute_capability) == list(tuned)
        self.portable = manifest.portable_index
        self._kernels: dict[int, Kernel] = {}
        if not self.tuned_gpu:
            portable = manifest.members[self.portable]
            warnings.warn(f"gemmgen library '{self.name}' was tuned for compute capability "
                          f"{tuned[0]}.{tuned[1]} ({manifest.device.name}); this {self.info.name} is "
                          f"{self.info.target}: every call runs its portable member "
                          f"{portable.name} ({portable.point})", RuntimeWarning, stacklevel=3)

    @property
    def plan(self):
        """The layouts and precision every member shares (bench reads them here)."""
        return self.plans[self.portable]

    def choose(self, M: int, N: int, K: int, lda: int, ldb: int, ldc: int,
               pointers: tuple[int, int, int] = (0, 0, 0), beta: float = 0.0, batch: int = 1,
               strides: tuple[int, int, int] = (0, 0, 0)) -> int:
        """Index of the member that runs this call (pointers: addresses, or their residues mod 16;
        `batch` matrices, A's, B's and C's `strides` apart in floats)."""
        if not self.tuned_gpu:
            return self.portable
        return self._choose(M, N, K, alignment_class(lda, ldb, ldc, pointers, strides), beta != 0.0, batch)

    @lru_cache(maxsize=4096)  # noqa: B019 - one runtime per library and device, kept for the process
    def _choose(self, M: int, N: int, K: int, klass: str, beta_used: bool, batch: int = 1) -> int:
        return choose(self.candidates, M, N, K, klass, self.info.sm_count, beta_used=beta_used,
                      sm90a=self.info.compute_capability == (9, 0), batch=batch, exact_rows=self.exact_rows)

    def compile_all(self) -> None:
        """Compile every member at once (NVRTC in parallel processes, into the disk cache), so that
        the first call of each does not wait for its compile."""
        compile_all([self.kernel_plan(i) for i in range(len(self.plans))])

    def kernel_plan(self, index: int):
        """The plan a member runs as here: its own, or (on a GPU the library was not tuned for)
        the portable member's, planned for this GPU."""
        plan = self.plans[index]
        if self.tuned_gpu:
            return plan
        target = self.info.target if self.info.target in ("sm_80", "sm_86", "sm_89", "sm_90") else "sm_80"
        return make_plan(self.plans[self.portable].spec.with_values(target=target))

    def kernel(self, index: int) -> Kernel:
        if index not in self._kernels:
            self._kernels[index] = Kernel(self.kernel_plan(index), device=self.device)
        return self._kernels[index]

    def prepare(self, M: int, N: int, K: int, lda: int, ldb: int, ldc: int,
                align: tuple[int, int, int] = (0, 0, 0), beta_used: bool = False, batch: int = 1,
                strides: tuple[int, int, int] = (0, 0, 0)):
        """The chosen member's prepared launch for a call key (see Kernel.prepare); for an unaligned
        call that pays to pad (padding.py), a PaddedLaunch of the aligned member."""
        index = self.choose(M, N, K, lda, ldb, ldc, align, 1.0 if beta_used else 0.0, batch, strides)
        run = self.kernel(index).prepare(M, N, K, lda, ldb, ldc, align, beta_used, batch, strides)
        padded = self.padding(M, N, K, (lda, ldb, ldc), align, beta_used, batch, strides)
        if padded is None:
            return run
        member, pads = padded
        aligned = self.kernel(member).prepare(M, N, K, *pads.lds, (0, 0, 0), beta_used, batch, pads.strides)
        return PaddedLaunch(pads, member, aligned, run, self.device, self.manifest.precision == "tf32")

    def padding(self, M: int, N: int, K: int, lds: tuple[int, int, int], align: tuple[int, int, int],
                beta_used: bool, batch: int = 1, strides: tuple[int, int, int] = (0, 0, 0)):
        """(the aligned member, the Padding) of a call that pays to pad, else None (align: A's, B's
        and C's addresses, or their residues mod 16)."""
        pads = padding(self.layouts, M, N, K, lds, align, batch, strides) if self.tuned_gpu else None
        member = self._padded(M, N, K, tuple(pads.copies(beta_used)), beta_used, batch,
                              alignment_class(*pads.lds, strides=pads.strides)) if pads else -1
        return (member, pads) if member >= 0 else None

    @lru_cache(maxsize=4096)  # noqa: B019 - as _choose
    def _padded(self, M: int, N: int, K: int, copies: tuple, beta_used: bool, batch: int, padded_class: str) -> int:
        return choose_padded(self.candidates, M, N, K, list(copies), self.info.sm_count, beta_used=beta_used,
                             sm90a=self.info.compute_capability == (9, 0), batch=batch, padded_class=padded_class,
                             exact_rows=self.exact_rows)

    def launch(self, M: int, N: int, K: int, alpha: float, A: int, lda: int, B: int, ldb: int,
               beta: float, C: int, ldc: int, stream: Any = None, smallest=None, batch: int = 1,
               strides: tuple[int, int, int] = (0, 0, 0)) -> int:
        """The library's C ABI on raw device addresses (with `batch` and `strides`: its batched
        entry point's); returns the index of the member that ran (for a call that pads, the aligned
        member's)."""
        A, B, C = int(A or 0), int(B or 0), int(C or 0)  # a null pointer may come as None
        index, padded = self._decide(M, N, K, lda, ldb, ldc, A % 16, B % 16, C % 16, beta != 0.0, batch, tuple(strides))
        if padded is None:
            self.kernel(index).launch(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream=stream, batch=batch,
                                      strides=strides)
            return index
        run = self._prepared(M, N, K, lda, ldb, ldc, A % 16, B % 16, C % 16, beta != 0.0, batch, tuple(strides))
        if not C or not A or not B:
            raise CudaError(f"{self.name}: null pointer for a matrix with elements", 1)
        run(A, B, C, alpha, beta, stream_handle(stream))
        return index

    @lru_cache(maxsize=256)  # noqa: B019 - a padded call key's launch, made once
    def _prepared(self, M: int, N: int, K: int, lda: int, ldb: int, ldc: int, a16: int, b16: int, c16: int,
                  beta_used: bool, batch: int, strides: tuple[int, int, int]):
        return self.prepare(M, N, K, lda, ldb, ldc, (a16, b16, c16), beta_used, batch, strides)

    @lru_cache(maxsize=4096)  # noqa: B019 - a call's whole decision, once per call key (host time per call)
    def _decide(self, M: int, N: int, K: int, lda: int, ldb: int, ldc: int, a16: int, b16: int, c16: int,
                beta_used: bool, batch: int, strides: tuple[int, int, int]):
        """(the member that runs, the Padding or None) of a call key."""
        padded = self.padding(M, N, K, (lda, ldb, ldc), (a16, b16, c16), beta_used, batch, strides)
        if padded is not None:
            return padded
        return self.choose(M, N, K, lda, ldb, ldc, (a16, b16, c16), 1.0 if beta_used else 0.0, batch, strides), None


def _relaid(plan, relaid: tuple[str, ...], c_layout: str, suffix: str):
    """A member's plan built in a relaid class's layouts, with the settings its mainloop takes there
    (Mainloop.relaid_settings) where they plan, else in the layouts alone (SpecError where not even so)."""
    spec = replace(plan.spec.with_values(layout_A=relaid[0], layout_B=relaid[1], layout_C=c_layout),
                   name=f"{plan.spec.name}_{suffix}")
    extra = plan.mainloop.relaid_settings(plan, relaid[0], relaid[1])
    if extra:
        try:
            return make_plan(spec.with_values(**extra))
        except SpecError:
            pass
    return make_plan(spec)
