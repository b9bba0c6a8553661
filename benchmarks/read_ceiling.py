"""How fast can a decode-sized GEMM read its weight on this GPU? (issue 28's 80% of HBM at 16 rows)

    python benchmarks/read_ceiling.py --out ceiling.jsonl

Per weight of N x K floats (K contiguous; 4096 x 4096, 11008 x 4096, 4096 x 11008, 14336 x 4096 and
128256 x 4096), rotated over at least 256 MB as benchmarks/decode.py rotates it so that no call finds
it in L2, one JSON line of fractions of HBM3's 3.35 TB/s (bytes of the weight over the median of 5
batches of 10 calls, CUDA events):
- read4 / read8 / read16: a kernel that only reads (float4s summed in a grid-stride loop, 4, 8 or 16
  blocks of 256 threads per SM): the roof;
- v1_P_U_S_W: 16 rows of A against the weight on mma.sync m16n8k8 (P 1: TF32, 3: 3xTF32), A's
  fragments read through L1 (no shared memory, no block barrier), U float4s of the lane's column in
  flight and double-buffered; W tiles of 8 columns per block, each tile's K split over S warps,
  summed in shared memory. Each with its error against float64.
Needs a CUDA GPU and CuPy. Its record: benchmarks/decode/2026-11-26-h100-71fb071-read-ceiling.md.
"""
import argparse
import json
import math
import sys
from pathlib import Path

import cupy as cp
import numpy as np

# The plain read and the mma.sync helpers (decode_patterns.py builds on them too).
HELPERS = r'''
extern "C" __global__ void __launch_bounds__(256) read_all(const float4* __restrict__ p, long long n4, float* out) {
    float s = 0.f;
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    #pragma unroll 8
    for (; i < n4; i += stride) { float4 v = __ldg(p + i); s += v.x + v.y + v.z + v.w; }
    if (s == 123.456f) out[0] = s;
}

__device__ __forceinline__ unsigned to_tf32(float x) { unsigned r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r; }
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
    big = to_tf32(x); small = to_tf32(x - __uint_as_float(big)); }
__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <int P>
__device__ __forceinline__ void step(float (&c)[4], float (&cs)[4], float a0, float a1, float a2, float a3, float b0, float b1) {
    unsigned ab[4], bb[2];
    if constexpr (P == 3) {
        unsigned as[4], bs[2];
        split_tf32(a0, ab[0], as[0]); split_tf32(a1, ab[1], as[1]); split_tf32(a2, ab[2], as[2]); split_tf32(a3, ab[3], as[3]);
        split_tf32(b0, bb[0], bs[0]); split_tf32(b1, bb[1], bs[1]);
        mma_tf32(cs, as, bb); mma_tf32(cs, ab, bs);
    } else {
        ab[0] = to_tf32(a0); ab[1] = to_tf32(a1); ab[2] = to_tf32(a2); ab[3] = to_tf32(a3);
        bb[0] = to_tf32(b0); bb[1] = to_tf32(b1);
    }
    mma_tf32(c, ab, bb);
}
'''

SRC = HELPERS + r'''
// V1: 16 rows, A fragments from global (L1), B float4s in registers, double-buffered. Block: TILES tiles
// of 8 columns x SLICES warps each (slice s takes chunks s, s+SLICES, ...). K % 16 == 0.
template <int P, int U, int SLICES, int TILES>
__device__ void dec_v1(int N, int K, const float* __restrict__ S, int lds, const float* __restrict__ G, long long ldg,
                       float* __restrict__ C, int ldc) {
    __shared__ float part[SLICES > 1 ? (SLICES - 1) * TILES * 128 : 1];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tile = warp % TILES, slice = warp / TILES;
    const int g = lane / 4, t = lane % 4;
    const int j = (blockIdx.x * TILES + tile) * 8 + g;
    const bool live = j < N;
    const float4* col = reinterpret_cast<const float4*>(G + (live ? (long long)j * ldg : 0) + 4 * t);
    const float4* ra = reinterpret_cast<const float4*>(S + g * lds + 4 * t);
    const float4* rb = reinterpret_cast<const float4*>(S + (g + 8) * lds + 4 * t);
    const int chunks = K / 16;
    float c[4] = {0,0,0,0}, cs[4] = {0,0,0,0};
    float4 b0[U], b1[U];
    #pragma unroll
    for (int u = 0; u < U; ++u) { int q = slice + u * SLICES; b0[u] = (q < chunks) ? __ldg(col + q * 4) : make_float4(0,0,0,0); }
    for (int q0 = slice; q0 < chunks; q0 += 2 * SLICES * U) {
        #pragma unroll
        for (int u = 0; u < U; ++u) { int q = q0 + (U + u) * SLICES; b1[u] = (q < chunks) ? __ldg(col + q * 4) : make_float4(0,0,0,0); }
        float p[4] = {0,0,0,0}, ps[4] = {0,0,0,0};
        #pragma unroll
        for (int u = 0; u < U; ++u) {
            int q = min(q0 + u * SLICES, chunks - 1);
            float4 a = __ldg(ra + q * 4), a8 = __ldg(rb + q * 4);
            step<P>(p, ps, a.x, a8.x, a.y, a8.y, b0[u].x, b0[u].y);
            step<P>(p, ps, a.z, a8.z, a.w, a8.w, b0[u].z, b0[u].w);
        }
        #pragma unroll
        for (int u = 0; u < U; ++u) { int q = q0 + (2 * U + u) * SLICES; b0[u] = (q < chunks) ? __ldg(col + q * 4) : make_float4(0,0,0,0); }
        #pragma unroll
        for (int u = 0; u < U; ++u) {
            int q = min(q0 + (U + u) * SLICES, chunks - 1);
            float4 a = __ldg(ra + q * 4), a8 = __ldg(rb + q * 4);
            step<P>(p, ps, a.x, a8.x, a.y, a8.y, b1[u].x, b1[u].y);
            step<P>(p, ps, a.z, a8.z, a.w, a8.w, b1[u].z, b1[u].w);
        }
        #pragma unroll
        for (int i = 0; i < 4; ++i) { c[i] += p[i]; cs[i] += ps[i]; }
    }
    #pragma unroll
    for (int i = 0; i < 4; ++i) c[i] += cs[i];
    if (SLICES > 1) {
        if (slice > 0) for (int i = 0; i < 4; ++i) part[((slice - 1) * TILES + tile) * 128 + lane * 4 + i] = c[i];
        __syncthreads();
    }
    if (slice == 0) {
        for (int i = 0; i < 4; ++i) {
            int r = g + 8 * (i / 2), jc = (blockIdx.x * TILES + tile) * 8 + 2 * t + i % 2;
            if (jc >= N) continue;
            float sum = c[i];
            for (int s = 1; s < SLICES; ++s) sum += part[((s - 1) * TILES + tile) * 128 + lane * 4 + i];
            C[r * ldc + jc] = sum;
        }
    }
}
'''
VARIANTS = []
for P in (1, 3):
    for U in (2, 4):
        for SL, TI in ((8, 1), (4, 2), (2, 4), (4, 1), (16, 1)):
            VARIANTS.append((P, U, SL, TI))
for (P, U, SL, TI) in VARIANTS:
    SRC += f'''
extern "C" __global__ void __launch_bounds__({32*SL*TI}) v1_{P}_{U}_{SL}_{TI}(int N, int K, const float* S, int lds, const float* G, long long ldg, float* C, int ldc)
{{ dec_v1<{P}, {U}, {SL}, {TI}>(N, K, S, lds, G, ldg, C, ldc); }}
'''


def median_ms(fn, calls=10, rounds=5):
    """fn(i) (i: the call's number, to rotate the weight's copies) once untimed, then the median over
    `rounds` batches of `calls` calls of a call's milliseconds, by CUDA events."""
    fn(0)
    cp.cuda.Device().synchronize()
    ts = []
    for r in range(rounds):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for i in range(calls):
            fn(r * calls + i)
        e1.record()
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) / calls)
    return sorted(ts)[len(ts) // 2]


def parse_out(argv, doc: str, what: str) -> argparse.Namespace:
    """The probe's one option, --out (`what` file to write, never replaced), refused before any work if
    the file exists."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--out", required=True, help=f"{what} file to write (never replaced)")
    args = parser.parse_args(argv)
    if Path(args.out).exists():
        sys.exit(f"error: {args.out} exists; name another file")
    return args


def main(argv=None):
    args = parse_out(argv, __doc__, "JSON lines")
    mod = cp.RawModule(code=SRC, options=("-std=c++17", "--use_fast_math"), name_expressions=None)
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    out = cp.zeros(4, cp.float32)
    results = []
    for (N, K) in ((4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096), (128256, 4096)):
        nbytes = N * K * 4
        copies = max(2, math.ceil(256e6 / nbytes))
        big = cp.random.rand(copies * N * K, dtype=cp.float32)
        S = cp.random.rand(16 * K, dtype=cp.float32) - 0.5
        ra = mod.get_function("read_all")
        row = {"shape": f"{N}x{K}"}
        for blocks_per_sm in (4, 8, 16):
            ms = median_ms(lambda i: ra((sms * blocks_per_sm,), (256,),
                                     (big[(i % copies) * N * K:], np.int64(N * K // 4), out)))
            row[f"read{blocks_per_sm}"] = round(nbytes / ms / 1e6 / 3350, 3)
        C = cp.zeros((16, N), cp.float32)
        for (P, U, SL, TI) in VARIANTS:
            f = mod.get_function(f"v1_{P}_{U}_{SL}_{TI}")
            grid = (N // 8 + TI - 1) // TI
            try:
                ms = median_ms(lambda i: f((grid,), (32 * SL * TI,), (np.int32(N), np.int32(K), S, np.int32(K),
                                                                   big[(i % copies) * N * K:], np.int64(K), C,
                                                                   np.int32(N))))
            except Exception as exc:
                row[f"v1_{P}_{U}_{SL}_{TI}"] = str(exc)[:80]; continue
            # check
            Gm = big[:N * K].reshape(N, K)
            f((grid,), (32 * SL * TI,), (np.int32(N), np.int32(K), S, np.int32(K), big, np.int64(K), C, np.int32(N)))
            ref = (S.reshape(16, K).astype(cp.float64) @ Gm.astype(cp.float64).T)
            err = float(cp.linalg.norm(C - ref) / cp.linalg.norm(ref))
            row[f"v1_{P}_{U}_{SL}_{TI}"] = (round(nbytes / ms / 1e6 / 3350, 3), f"{err:.1e}")
        print(json.dumps(row), flush=True)
        results.append(row)
        big = None  # the next weight's copies in its place
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in results))

if __name__ == "__main__":
    main()
