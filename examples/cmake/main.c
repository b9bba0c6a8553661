/* A C program calling a gemmgen kernel: C = A*B for 256 x 256 matrices of ones, so every entry
   of C is 256. Built by CMakeLists.txt beside it. */
#include <stdio.h>
#include <stdlib.h>

#include "warptile.h"

int main(void)
{
    enum { M = 256, N = 256, K = 256 };
    static float host_A[M * K], host_B[K * N], host_C[M * N];
    float *A = NULL, *B = NULL, *C = NULL;
    int i, status;

    for (i = 0; i < M * K; ++i) host_A[i] = 1.0f;
    for (i = 0; i < K * N; ++i) host_B[i] = 1.0f;
    if (cudaMalloc((void **)&A, sizeof host_A) != cudaSuccess ||
        cudaMalloc((void **)&B, sizeof host_B) != cudaSuccess ||
        cudaMalloc((void **)&C, sizeof host_C) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed: is there a GPU?\n");
        return 1;
    }
    cudaMemcpy(A, host_A, sizeof host_A, cudaMemcpyHostToDevice);
    cudaMemcpy(B, host_B, sizeof host_B, cudaMemcpyHostToDevice);

    /* Row-major A, B and C (warptile's layouts): the leading dimensions are the row lengths. */
    status = gemmgen_warptile(M, N, K, 1.0f, A, K, B, N, 0.0f, C, N, 0);
    if (status == cudaSuccess) status = cudaDeviceSynchronize();
    if (status != cudaSuccess) {
        fprintf(stderr, "gemmgen_warptile: %s\n", cudaGetErrorString((cudaError_t)status));
        return 1;
    }
    cudaMemcpy(host_C, C, sizeof host_C, cudaMemcpyDeviceToHost);
    printf("C[0][0] = %g, C[%d][%d] = %g (expected %d)\n", host_C[0], M - 1, N - 1,
           host_C[M * N - 1], K);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    return host_C[0] == K && host_C[M * N - 1] == K ? 0 : 1;
}
