"""A copied operand streamed beside its GEMM (PyTorch tensors): where a call must copy one large
operand into the layout its library reads (A col with B row in tf32: wgmma reads B only K-major),
the copy goes in chunks on a side stream while the GEMM of each chunk runs on the caller's stream
as soon as its part has landed. The GEMM waits for one chunk's copy instead of the whole one.

A chunk is a band of B's columns (and of C's) when B is copied, a band of A's rows (and of C's)
when A is; each band's GEMM is an independent call of the same library. `plan` decides whether a
call streams and in how many chunks; `run` does it. Measured on an H100 (BENCHMARKS.md): A col,
B row at 4096^3 in tf32 ran at 0.87x the library's best layout with the copy before the GEMM."""

from __future__ import annotations

from typing import Callable

from .layouts import Route

STREAM_MIN_FLOATS = 1 << 22   # a copied operand below 16 MB copies in under ~15 us: not worth chunks
CHUNK_MIN = 1024              # rows or columns of C per chunk: each chunk's GEMM still fills the GPU
CHUNKS_MAX = 4                # the first chunk's copy is what the GEMM waits for: a quarter at most
CHUNK_ALIGN = 256             # chunk edges on whole tiles and 16-byte addresses


def plan(route: Route, M: int, N: int, K: int, batched: bool) -> int:
    """Chunks to stream a call's one copied operand in; 0 where the call copies as a whole (no copy,
    copies of both operands or of C, batches, or an operand too small to pay)."""
    if batched or route.copy_c or bool(route.copy_a) == bool(route.copy_b):
        return 0
    floats, width = (M * K, M) if route.copy_a else (K * N, N)
    if floats < STREAM_MIN_FLOATS:
        return 0
    chunks = min(CHUNKS_MAX, width // CHUNK_MIN)
    return chunks if chunks > 1 else 0


def bounds(width: int, chunks: int) -> list[tuple[int, int]]:
    """[start, end) of each chunk of `width` rows or columns: equal, on CHUNK_ALIGN edges."""
    step = -(-width // chunks // CHUNK_ALIGN) * CHUNK_ALIGN
    return [(start, min(width, start + step)) for start in range(0, width, step)]


def run(torch, route: Route, chunks: int, A, B, out, gemm: Callable, copy: Callable):
    """out = the call with the copied operand streamed: for each chunk, `copy(x, layout)` of its band
    on a side stream, then `gemm(A_band, B_band, out_band)` on the current stream after it."""
    device = out.get_device()
    main = torch.cuda.current_stream(device)
    side = _side_stream(torch, device)
    side.wait_stream(main)  # the operands and out are ready on the caller's stream
    by_rows = bool(route.copy_a)
    width = A.shape[0] if by_rows else B.shape[1]
    for start, end in bounds(width, chunks):
        with torch.cuda.stream(side):
            band = copy(A[start:end] if by_rows else B[:, start:end], route.copy_a or route.copy_b)
        landed = torch.cuda.Event()
        landed.record(side)
        main.wait_event(landed)
        band.record_stream(main)  # the allocator keeps it until the GEMM on the caller's stream is done
        if by_rows:
            gemm(band, B, out[start:end])
        else:
            gemm(A, band, out[:, start:end])
    return out


_sides: dict[int, object] = {}


def _side_stream(torch, device: int):
    """One side stream per device, made on first use."""
    side = _sides.get(device)
    if side is None:
        side = _sides[device] = torch.cuda.Stream(device)
    return side
