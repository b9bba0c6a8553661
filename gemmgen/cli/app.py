"""The gemmgen command: the group of verbs (one module each: build, explain, check, bench, tune,
replay, profile), which turns every expected failure into one line and an exit status.

    gemmgen build specs/warptile.gemm          # -> generated/warptile.cu
    gemmgen explain specs/warptile.gemm        # threads, registers, occupancy, bank conflicts
    gemmgen check specs/warptile.gemm          # validate on the GPU against float64
    gemmgen bench specs/warptile.gemm --plot bench.png
"""

from __future__ import annotations

import sys

import click

from ..gpu.compile import CompileError
from ..gpu.runtime import CudaError, ShapeError
from ..language.errors import SpecError
from ..multigpu.split import MultiGpuError
from ..outputs import OutputError
from ..tuning.database import DatabaseError
from ..tuning.replay import ReplayError
from ..version import __version__
from .bench import bench
from .build import build
from .check import check
from .common import INTERRUPTED, fail
from .explain import explain
from .profile import profile_command
from .replay import replay
from .terminal import err as errors
from .tune import tune


class _Group(click.Group):
    """Turns SpecErrors, compile errors, bad databases and Ctrl-C into messages, never tracebacks."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SpecError as exc:
            errors.print(str(exc), soft_wrap=True)
            sys.exit(1)
        except CompileError as exc:
            fail(f"the generated source did not compile (a gemmgen bug: please report it "
                  f"with the spec):\n{exc}")
        except (CudaError, ShapeError, MultiGpuError, OutputError, DatabaseError, ReplayError) as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            # Every output is written whole or not at all (outputs.py), so there is nothing to undo.
            fail("interrupted: no output was left half-written (a tune resumes from its database "
                  "when run again)", code=INTERRUPTED)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gemmgen")
def main() -> None:
    """gemmgen: compile a tiling spec into a fast, readable SGEMM CUDA kernel.

    A spec (.gemm file) describes the tiling of C = alpha*A@B + beta*C: the block, warp and
    thread tiles, how A and B travel to shared memory (vector width, transpose, padding or
    swizzle), how many buffers the pipeline has, and the target GPU. For example:

    \b
        kernel warptile {
          target   sm_90
          block    128 x 128 x 16
          warp     64 x 64
          thread   8 x 4 repeat 1 x 4
          load A   vector 4 transpose
          load B   vector 4
          stages   2 sync
          raster   group 8
        }

    Typical session:

    \b
        gemmgen explain specs/warptile.gemm   # what it will cost, before any GPU time
        gemmgen build   specs/warptile.gemm   # writes generated/warptile.cu
        gemmgen check   specs/warptile.gemm   # correct on every shape? (GPU)
        gemmgen bench   specs/warptile.gemm   # how fast beside cuBLAS? (GPU)

    The emitted .cu has one entry point, callable from any CUDA build:

    \b
        extern "C" int gemmgen_<name>(int M, int N, int K, float alpha,
            const float *A, int lda, const float *B, int ldb, float beta,
            float *C, int ldc, cudaStream_t stream);
    """


for command in (build, explain, check, bench, tune, replay, profile_command):
    main.add_command(command)
