"""Is the decode tensor path's gap to the read roof its access pattern? (issue 28: 80% of HBM at 16 rows)

    python benchmarks/decode_patterns.py --out patterns.json

Per weight of N x K floats (K contiguous: 4096 x 4096, 11008 x 4096, 4096 x 11008, 14336 x 4096,
32000 x 4096), rotated over at least 256 MB so that no call finds it in L2, fractions of HBM3's
3.35 TB/s (the weight's bytes over the median of 5 batches of 10 calls, CUDA events) of:
- read_all: a kernel that only reads (float4s summed in a grid-stride loop, 8 blocks of 256 per SM);
- cols_W_U_SL: the same reads by tiles of 8 columns, as the decode tensor path reads them: lane 4g + t
  takes W consecutive float4s of column g per chunk of 16 W floats, U chunks in flight, SL warps per
  tile (each a slice of K);
- dec_P_W_U_SL: 16 rows x the weight on mma.sync m16n8k8 with that pattern (P 1: TF32, 3: 3xTF32),
  A's float4s read through L1 (no shared memory, no block barrier), the loads double-buffered, the
  slices summed in shared memory; each with its error against float64.
The shipped tensor path (decode.cuh.j2) reads one float4 per lane per chunk (W = 1) and stages A
through shared memory one K tile at a time. Needs a CUDA GPU and CuPy. Its record:
benchmarks/decode/2026-11-27-h100-21fda59-decode-patterns.json.
"""
import json
import math
from pathlib import Path

import cupy as cp
import numpy as np

from read_ceiling import HELPERS, median_ms, parse_out  # the plain read, the mma.sync helpers, the timing

SRC = HELPERS + r'''
// Read only: a block of SL warps per tile of 8 columns; lane (g, t) reads W consecutive float4s of column g
// per chunk (chunk q of a column: 16 W floats; lane t at float4 q*4W + tW .. + W-1), U chunks in flight.
template <int W, int U, int SL>
__device__ void cols(int N, int K, const float* __restrict__ G, long long ldg, float* out) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int j = blockIdx.x * 8 + g;
    const float4* col = reinterpret_cast<const float4*>(G + (long long)j * ldg) + t * W;
    const int chunks = K / (16 * W);
    float s = 0.f;
    for (int q0 = warp; q0 < chunks; q0 += SL * U) {
        float4 b[U][W];
        #pragma unroll
        for (int u = 0; u < U; ++u)
            #pragma unroll
            for (int w = 0; w < W; ++w) { int q = q0 + u * SL; b[u][w] = q < chunks ? __ldg(col + q * 4 * W + w) : make_float4(0,0,0,0); }
        #pragma unroll
        for (int u = 0; u < U; ++u)
            #pragma unroll
            for (int w = 0; w < W; ++w) s += b[u][w].x + b[u][w].y + b[u][w].z + b[u][w].w;
    }
    if (s == 123.456f) out[0] = s;
}
// 16 rows x the weight on mma.sync, the same pattern, double-buffered; A's float4s through L1; slices summed in
// shared memory; C (16 x N) written.
template <int P, int W, int U, int SL>
__device__ void dec(int N, int K, const float* __restrict__ S, int lds, const float* __restrict__ G, long long ldg,
                    float* __restrict__ C, int ldc) {
    __shared__ float part[SL > 1 ? (SL - 1) * 128 : 1];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int j = blockIdx.x * 8 + g;
    const bool live = j < N;
    const float4* col = reinterpret_cast<const float4*>(G + (live ? (long long)j * ldg : 0)) + t * W;
    const float4* ra = reinterpret_cast<const float4*>(S + g * lds) + t * W;
    const float4* rb = reinterpret_cast<const float4*>(S + (g + 8) * lds) + t * W;
    const int chunks = K / (16 * W);
    float c[4] = {0,0,0,0}, cs[4] = {0,0,0,0};
    float4 b0[U][W], b1[U][W];
    #pragma unroll
    for (int u = 0; u < U; ++u)
        #pragma unroll
        for (int w = 0; w < W; ++w) { int q = warp + u * SL; b0[u][w] = q < chunks ? __ldg(col + q * 4 * W + w) : make_float4(0,0,0,0); }
    for (int q0 = warp; q0 < chunks; q0 += 2 * SL * U) {
        #pragma unroll
        for (int u = 0; u < U; ++u)
            #pragma unroll
            for (int w = 0; w < W; ++w) { int q = q0 + (U + u) * SL; b1[u][w] = q < chunks ? __ldg(col + q * 4 * W + w) : make_float4(0,0,0,0); }
        float p[4] = {0,0,0,0}, ps[4] = {0,0,0,0};
        #pragma unroll
        for (int u = 0; u < U; ++u) {
            int q = min(q0 + u * SL, chunks - 1);
            #pragma unroll
            for (int w = 0; w < W; ++w) {
                float4 a = __ldg(ra + q * 4 * W + w), a8 = __ldg(rb + q * 4 * W + w);
                step<P>(p, ps, a.x, a8.x, a.y, a8.y, b0[u][w].x, b0[u][w].y);
                step<P>(p, ps, a.z, a8.z, a.w, a8.w, b0[u][w].z, b0[u][w].w);
            }
        }
        #pragma unroll
        for (int u = 0; u < U; ++u)
            #pragma unroll
            for (int w = 0; w < W; ++w) { int q = q0 + (2 * U + u) * SL; b0[u][w] = q < chunks ? __ldg(col + q * 4 * W + w) : make_float4(0,0,0,0); }
        #pragma unroll
        for (int u = 0; u < U; ++u) {
            int q = min(q0 + (U + u) * SL, chunks - 1);
            #pragma unroll
            for (int w = 0; w < W; ++w) {
                float4 a = __ldg(ra + q * 4 * W + w), a8 = __ldg(rb + q * 4 * W + w);
                step<P>(p, ps, a.x, a8.x, a.y, a8.y, b1[u][w].x, b1[u][w].y);
                step<P>(p, ps, a.z, a8.z, a.w, a8.w, b1[u][w].z, b1[u][w].w);
            }
        }
        #pragma unroll
        for (int i = 0; i < 4; ++i) { c[i] += p[i]; cs[i] += ps[i]; }
    }
    #pragma unroll
    for (int i = 0; i < 4; ++i) c[i] += cs[i];
    if (SL > 1) {
        if (warp > 0) for (int i = 0; i < 4; ++i) part[(warp - 1) * 128 + lane * 4 + i] = c[i];
        __syncthreads();
    }
    if (warp == 0) {
        for (int i = 0; i < 4; ++i) {
            int r = g + 8 * (i / 2), jc = blockIdx.x * 8 + 2 * t + i % 2;
            if (jc >= N) continue;
            float sum = c[i];
            for (int s = 1; s < SL; ++s) sum += part[(s - 1) * 128 + lane * 4 + i];
            C[r * ldc + jc] = sum;
        }
    }
}
'''
READS = [(W, U, SL) for W in (1, 2, 4) for U in ((4, 8) if W == 1 else (2, 4) if W == 2 else (1, 2)) for SL in (8, 16)]
DECS = [(P, W, U, SL) for P in (1, 3) for W in (1, 2, 4) for U in ((2, 4) if W == 1 else (1, 2) if W == 2 else (1,))
        for SL in (8, 16)]
for (W, U, SL) in READS:
    SRC += f'extern "C" __global__ void __launch_bounds__({32*SL}) cols_{W}_{U}_{SL}(int N, int K, const float* G, long long ldg, float* out) {{ cols<{W}, {U}, {SL}>(N, K, G, ldg, out); }}\n'
for (P, W, U, SL) in DECS:
    SRC += f'extern "C" __global__ void __launch_bounds__({32*SL}) dec_{P}_{W}_{U}_{SL}(int N, int K, const float* S, int lds, const float* G, long long ldg, float* C, int ldc) {{ dec<{P}, {W}, {U}, {SL}>(N, K, S, lds, G, ldg, C, ldc); }}\n'

def main(argv=None):
    args = parse_out(argv, __doc__, "JSON")
    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    out = cp.zeros(4, cp.float32)
    rows = []
    for (N, K) in ((4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096), (32000, 4096)):
        nbytes = N * K * 4
        copies = max(2, math.ceil(256e6 / nbytes))
        big = cp.random.rand(copies * N * K, dtype=cp.float32) - 0.5
        S = cp.random.rand(16 * K, dtype=cp.float32) - 0.5
        row = {"shape": f"{N}x{K}"}
        f = mod.get_function("read_all")
        ms = median_ms(lambda i: f((sms * 8,), (256,), (big[(i % copies) * N * K:], np.int64(N * K // 4), out)))
        row["read_all"] = round(nbytes / ms / 1e6 / 3350, 3)
        for (W, U, SL) in READS:
            f = mod.get_function(f"cols_{W}_{U}_{SL}")
            ms = median_ms(lambda i: f((N // 8,), (32 * SL,), (np.int32(N), np.int32(K), big[(i % copies) * N * K:], np.int64(K), out)))
            row[f"cols_{W}_{U}_{SL}"] = round(nbytes / ms / 1e6 / 3350, 3)
        C = cp.zeros((16, N), cp.float32)
        Gm = big[:N * K].reshape(N, K)
        ref = S.reshape(16, K).astype(cp.float64) @ Gm.astype(cp.float64).T
        for (P, W, U, SL) in DECS:
            f = mod.get_function(f"dec_{P}_{W}_{U}_{SL}")
            call_args = lambda i: (np.int32(N), np.int32(K), S, np.int32(K), big[(i % copies) * N * K:], np.int64(K), C, np.int32(N))
            ms = median_ms(lambda i: f((N // 8,), (32 * SL,), call_args(i)))
            C[...] = 0
            f((N // 8,), (32 * SL,), call_args(0))
            err = float(cp.linalg.norm(C - ref) / cp.linalg.norm(ref))
            row[f"dec_{P}_{W}_{U}_{SL}"] = [round(nbytes / ms / 1e6 / 3350, 3), float(f"{err:.2e}")]
        print(json.dumps(row), flush=True)
        rows.append(row)
        big = None
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")

if __name__ == "__main__":
    main()
