"""One GEMM split over several GPUs of a host, the copies overlapping the kernels (split.py).
"""
