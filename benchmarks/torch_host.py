"""Host time per call of gemmgen.matmul, torch.ops.gemmgen.matmul and torch.matmul, in turns.

    python benchmarks/torch_host.py --out host.json [--precision fp32] [--calls 200] [--rounds 30]

For each shape (M x N x K: A is M x K, B = W.t() for W of N x K, as nn.Linear multiplies) and each
way of calling, a batch of back-to-back calls is timed on the host clock after the GPU has drained
(no CUDA events, no synchronisation inside the batch); a batch is short enough (--calls, default
200) that the launch queue never fills, so the host is never waiting for the GPU. The ways take
turns, batch by batch, --rounds times; the table gives each one's median per call (and its
fastest batch), in microseconds.

Ways of calling:
- torch.matmul(A, B);
- gemmgen.matmul(A, B), the fast path for tensors;
- torch.ops.gemmgen.matmul(A, B), the operator as gemmgen.torch registers it (its C++ kernels,
  gemmgen/torch/native.cpp, where they could be built; the record says which);
- the same operator registered with torch.library.custom_op (here, for comparison), which
  gemmgen.torch does not use;
- with `grad` in the name: A requiring grad and B a Parameter's transpose, as in training
  (torch.matmul and the operator record autograd; gemmgen.matmul does not and is left out);
- the layer with a bias and GELU, no autograd: PyTorch's F.gelu(F.linear(x, w, b)) (two kernels)
  beside gemmgen.linear(x, w, b, "gelu") (one, the bias and GELU in its store).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from torch_records import meta, refuse_to_overwrite, write_record

import gemmgen
import gemmgen.torch  # noqa: F401 - registers torch.ops.gemmgen.matmul
from gemmgen.torch.ops import _matmul_cuda, _matmul_fake, _setup_context, gradients

SHAPES = ((64, 64, 64), (16, 4096, 4096))


def custom_op_variant():
    """torch.ops.gemmgen_bench.matmul: the same kernel, fake and autograd through custom_op."""
    op = torch.library.custom_op("gemmgen_bench::matmul", mutates_args=())(_custom_op_kernel)
    op.register_fake(_matmul_fake)

    def backward(ctx, grad):
        return gradients(ctx, grad, lambda x, y: op(x, y, ctx.alpha, ctx.precision))

    def setup_context(ctx, inputs, output):
        _setup_context(ctx, *inputs)

    op.register_autograd(backward, setup_context=setup_context)
    return torch.ops.gemmgen_bench.matmul.default


def _custom_op_kernel(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0, precision: str = "fp32") -> torch.Tensor:
    return _matmul_cuda(a, b, alpha, precision)


def ways(precision: str):
    library_op = torch.ops.gemmgen.matmul.default
    custom = custom_op_variant()
    return {
        "torch.matmul": lambda a, b: torch.matmul(a, b),
        "gemmgen.matmul": lambda a, b: gemmgen.matmul(a, b, precision=precision),
        "torch.ops.gemmgen.matmul (Library)": lambda a, b: library_op(a, b, 1.0, precision),
        "torch.ops.gemmgen_bench.matmul (custom_op)": lambda a, b: custom(a, b, 1.0, precision),
    }


def batch_us(call, a, b, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call(a, b)
    elapsed = time.perf_counter() - start
    return elapsed / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write the results to")
    parser.add_argument("--force", action="store_true", help="replace --out even if gemmgen did not write it")
    parser.add_argument("--commit", help="the commit to record (default: $GEMMGEN_COMMIT, else git's HEAD)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "tf32"))
    parser.add_argument("--calls", type=int, default=200, help="calls per timed batch (keep below 1024)")
    parser.add_argument("--rounds", type=int, default=30, help="batches of each way, in turns")
    args = parser.parse_args()
    refuse_to_overwrite(args.out, args.force)

    calls = ways(args.precision)
    rows = []
    for M, N, K in SHAPES:
        a = torch.randn(M, K, device="cuda")
        weight = torch.nn.Parameter(torch.randn(N, K, device="cuda"))
        plain = (a, weight.detach().t())
        grad = (a.clone().requires_grad_(), weight.t())
        cases = [(name, call, plain) for name, call in calls.items()]
        cases += [(f"{name}, grad", call, grad) for name, call in calls.items() if name != "gemmgen.matmul"]
        # the fused layer beside PyTorch's: act(x @ w^T + b), no autograd recorded (inference)
        bias = torch.randn(N, device="cuda")
        fused = {"F.gelu(F.linear(x, w, b))": lambda a, b: torch.nn.functional.gelu(torch.nn.functional.linear(a, b.t(), bias)),
                 "gemmgen.linear(x, w, b, 'gelu')": lambda a, b: gemmgen.linear(a, b.t(), bias, "gelu",
                                                                                precision=args.precision)}
        cases += [(name, call, plain) for name, call in fused.items()]
        for _, call, operands in cases:  # warm: kernels compiled and loaded, call keys resolved
            for _ in range(3):
                call(*operands)
        torch.cuda.synchronize()
        times = {name: [] for name, _, _ in cases}
        for _ in range(args.rounds):
            for name, call, operands in cases:
                times[name].append(batch_us(call, *operands, args.calls))
        for name, _, _ in cases:
            rows.append({"shape": f"{M}x{N}x{K}", "way": name, "median_us": statistics.median(times[name]),
                         "min_us": min(times[name]), "batches": times[name]})
    device = torch.cuda.get_device_name()
    from gemmgen.torch.ops import python_kernels_reason
    kernels = "C++ (gemmgen/torch/native.cpp)" if python_kernels_reason is None else f"Python ({python_kernels_reason})"
    print(f"Host time per call on {device} ({platform.processor() or platform.machine()}), precision "
          f"{args.precision}, batches of {args.calls} calls in turns x {args.rounds}; the operator's kernels: "
          f"{kernels}:\n")
    print("| shape | way | median us/call | fastest batch us/call |")
    print("| --- | --- | ---: | ---: |")
    for row in rows:
        print(f"| {row['shape']} | {row['way']} | {row['median_us']:.1f} | {row['min_us']:.1f} |")
    write_record(args.out, {"meta": meta(args.commit, torch.device("cuda")), "device": device,
                            "torch": torch.__version__, "gemmgen": gemmgen.__version__, "precision": args.precision,
                            "operator_kernels": kernels, "calls_per_batch": args.calls, "rounds": args.rounds,
                            "rows": rows})
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
