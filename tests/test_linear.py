"""gemmgen.linear's kernels without a GPU (library/fused.py): every member of both shipped libraries
plans with a bias and each activation (a split-K member refuses a nonlinear one, and the caller runs
the epilogue as passes), under a name of its own, its tiling as tuned; one fused member compiles with
NVRTC and takes the bias after ldc. tests/test_linear_torch.py has the PyTorch side.
"""

from __future__ import annotations

import types

import pytest

from gemmgen.codegen.cuda import generate
from gemmgen.gpu.compile import compile_plan
from gemmgen.library import fused
from gemmgen.library.dispatch import shipped_manifest
from gemmgen.library import selection
from gemmgen.plan.parts.epilogue import ACTIVATIONS


class RuntimeOf:
    """What FusedMembers reads of a LibraryRuntime (no GPU): its members' plans and models, and an
    H100's SM count."""

    def __init__(self, precision):
        manifest = shipped_manifest(precision)
        self.plans = manifest.plans()
        self.candidates = manifest.candidates()
        self.device, self.tuned_gpu = 0, True
        self.info = types.SimpleNamespace(sm_count=132, compute_capability=(9, 0))
        self.exact_rows = selection.short_sum_rows(precision)

    def kernel_plan(self, index):
        return self.plans[index]

    def choose(self, M, N, K, lda, ldb, ldc, pointers=(0, 0, 0), beta=0.0):
        return selection.choose(self.candidates, M, N, K, selection.alignment_class(lda, ldb, ldc, pointers),
                                132, beta_used=False, sm90a=True)


class KernelRecorder:
    def __init__(self, plan, device=0):
        self.plan, self.device = plan, device


def test_an_activation_is_a_name_of_the_epilogue_table():
    assert fused.check_activation(None) == "none"
    assert fused.check_activation("gelu") == "gelu"
    with pytest.raises(ValueError) as error:
        fused.check_activation("tanh")
    message = str(error.value)
    assert "'tanh'" in message and all(repr(name) in message for name in ACTIVATIONS if name != "none")


def stages_its_store(spec) -> bool:
    """Whether the planner takes this spec with `epilogue staged` (TMA-fed, no split K)."""
    from gemmgen.language.errors import SpecError
    from gemmgen.plan import make_plan
    try:
        make_plan(spec.with_values(epilogue_staged=True))
        return True
    except SpecError:
        return False


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_every_member_of_a_shipped_library_plans_with_a_bias_and_each_activation(precision, monkeypatch):
    monkeypatch.setattr(fused, "Kernel", KernelRecorder)
    runtime = RuntimeOf(precision)
    members = fused.FusedMembers(runtime)
    for index, plan in enumerate(runtime.plans):
        for activation in ACTIVATIONS:
            kernel = members.kernel(index, True, activation)
            if kernel is None:  # refused: a nonlinear activation after split K's atomic sums, and the
                # decode member (no fused epilogue at all); nothing else
                atomic = plan.split_k > 1 and plan.scheduler.split_by == "atomic"
                assert (atomic and activation != "none") or plan.path == "decode", (plan.name, activation)
                continue
            spec = kernel.plan.spec
            if plan.split_k > 1 and plan.scheduler.split_by == "workspace":
                # split K through a workspace takes any epilogue (its last slice stores C), and keeps it
                assert (kernel.plan.split_k, kernel.plan.scheduler.split_by) == (plan.split_k, "workspace")
            assert (spec["bias"], spec["activation"]) == ("col", activation)
            # C is never read (gemmgen.linear's beta is 0): no beta code, which made the kernel 40% larger
            assert not spec["epilogue.beta"] and not kernel.plan.epilogue.beta and plan.spec["epilogue.beta"]
            assert kernel.plan.name == fused.fused_name(plan.name, True, activation)
            # the member's tiling and layouts stay as tuned: only the epilogue differs, and (TF32 wgmma
            # members, measured faster so) its store and schedule
            for setting in ("block.m", "block.n", "block.k", "math", "layout.A", "layout.B", "layout.C"):
                assert spec[setting] == plan.spec[setting]
            tf32_wgmma = plan.consumers and spec["math"] == "tf32"
            if tf32_wgmma and stages_its_store(spec):
                # staged, on the persistent walk where the member was data-parallel (and the plan takes it)
                assert spec["epilogue.staged"], plan.name
                if plan.spec["schedule"] == "data-parallel" and spec["schedule"] != "data-parallel":
                    assert spec["schedule"] == "persistent", plan.name
                else:
                    assert spec["schedule"] == plan.spec["schedule"] or plan.spec["schedule"] == "data-parallel"
            else:  # a 3xTF32 member (and mma.sync, SIMT, decode) keeps its store and schedule
                assert spec["schedule"] == plan.spec["schedule"], plan.name
                assert spec["epilogue.staged"] == plan.spec["epilogue.staged"], plan.name
            assert members.kernel(index, True, activation) is kernel  # planned once


def test_a_fused_member_compiles_and_takes_the_bias_after_ldc(monkeypatch):
    monkeypatch.setattr(fused, "Kernel", KernelRecorder)
    runtime = RuntimeOf("fp32")
    index = next(i for i, plan in enumerate(runtime.plans) if plan.split_k == 1)
    plan = fused.FusedMembers(runtime).kernel(index, True, "gelu").plan
    assert compile_plan(plan, use_cache=False).cubin.startswith(b"\x7fELF")
    source = generate(plan)
    launcher = " ".join(source[source.index('extern "C"'):].split())
    assert "int ldc, const float* bias" in launcher, launcher[:600]
    assert "activation_gelu(" in source  # the GELU in the store
    assert "beta * C" not in source and "beta != 0 (this kernel has no beta)" in launcher  # C is never read


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
@pytest.mark.parametrize("M, N, K", [(1, 4096, 4096), (16, 4096, 4096), (64, 64, 64), (2048, 5632, 2048)])
def test_a_call_runs_a_member_that_can_fuse(precision, M, N, K, monkeypatch):
    monkeypatch.setattr(fused, "Kernel", KernelRecorder)
    runtime = RuntimeOf(precision)
    members = fused.FusedMembers(runtime)
    library_choice = runtime.choose(M, N, K, K, K, N)

    def fastest_of(able):  # by the same models the library chooses with
        predicted = {i: selection.predict(runtime.candidates[i].shape, runtime.candidates[i].models["aligned"],
                                          M, N, K, 132) for i in able if runtime.candidates[i].models.get("aligned")}
        return min(predicted, key=predicted.get)
    index = members.choose(M, N, K, K, K, N, (0, 0, 0), True, "gelu")
    assert (members.kernel(index, True, "gelu") is not None) == (min(M, N) > 1)

    def fuses(plan, activation):
        # not the decode member; an activation not after atomic split K's sums (a workspace's are fine)
        atomic = plan.split_k > 1 and plan.scheduler.split_by == "atomic"
        return plan.path != "decode" and (not atomic or activation == "none")
    for activation, chosen in (("gelu", index), ("none", members.choose(M, N, K, K, K, N, (0, 0, 0), True, "none"))):
        if min(M, N) == 1:  # a matrix-vector product: the library's decode member, unfused, in FP32 as cuBLAS
            assert chosen == library_choice and runtime.plans[chosen].path == "decode"
            assert members.kernel(chosen, True, activation) is None
        elif fuses(runtime.plans[library_choice], activation):
            assert chosen == library_choice  # the library's own choice where it can fuse
        else:  # the fastest member that can
            assert chosen == fastest_of([i for i, plan in enumerate(runtime.plans) if fuses(plan, activation)])
