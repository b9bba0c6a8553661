"""gemmgen's transposing copy (the copy gemmgen.matmul makes of an operand that lies the other way)
beside PyTorch's (`x.t().contiguous()`), in turns: bandwidth counted as the bytes read plus the
bytes written over the time.

    python benchmarks/transpose.py --out transpose.json [--rounds 20] [--calls 10]

Ways: gemmgen's float4 kernel (rows 16-byte aligned), its float-at-a-time kernel (the same matrix
one float past alignment), and PyTorch's copy. Each way's batch of --calls copies is timed with
CUDA events; the ways take turns --rounds times and the table gives the median batch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_records import elapsed_ms, meta, refuse_to_overwrite, table, write_record  # noqa: E402

from gemmgen.gpu.transpose import transpose  # noqa: E402

SHAPES = ((4096, 4096, 1), (2048, 8192, 1), (8192, 2048, 1), (2048, 2048, 1), (128, 128, 256), (1024, 128, 32))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON record to write (not overwritten unless --force)")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    refuse_to_overwrite(args.out, args.force)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    device = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    results, rows_out = [], []
    for rows, cols, batch in SHAPES:
        n = batch * rows * cols
        src = torch.randn(n + 1, device=device)
        dst = torch.empty(n + 1, device=device)
        dense = src[:n].view(batch, rows, cols)

        def ours(offset):
            s, d = src.data_ptr() + 4 * offset, dst.data_ptr() + 4 * offset
            return lambda: [transpose(s, rows, cols, cols, d, rows, 0, stream, batch, (rows * cols, rows * cols))
                            for _ in range(args.calls)]
        ways = {"gemmgen float4": ours(0), "gemmgen float": ours(1),
                "torch": lambda: [dense.mT.contiguous() for _ in range(args.calls)]}
        for work in ways.values():
            work()
        torch.cuda.synchronize()
        for offset in (0, 1):  # the copies are exact
            ours(offset)()
            got = dst[offset:offset + n].view(batch, cols, rows)
            assert torch.equal(got, src[offset:offset + n].view(batch, rows, cols).mT), "transpose differs"
        times = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, work in ways.items():
                times[name].append(elapsed_ms(work, device) / args.calls)
        for name, ms in times.items():
            median = statistics.median(ms)
            tbps = 2 * 4 * n / (median * 1e-3) / 1e12
            results.append({"rows": rows, "cols": cols, "batch": batch, "way": name, "ms": median, "ms_all": ms,
                            "tb_per_s": tbps})
            rows_out.append([f"{batch} x {rows} x {cols}", name, f"{median * 1e3:.1f}", f"{tbps:.2f}"])
    text = table(["matrices", "way", "us", "TB/s (read + write)"], rows_out)
    print(text)
    write_record(args.out, {"generator": "gemmgen", "benchmark": "transpose", "meta": meta(args.commit, device),
                            "settings": {"rounds": args.rounds, "calls": args.calls,
                                         "timing": "CUDA events over a batch of calls, median batch over rounds in turns"},
                            "results": results, "table": text})
    return 0


if __name__ == "__main__":
    sys.exit(main())
