"""Running kernels: NVRTC to a cubin for the exact target and its on-disk cache (compile.py,
compile_cache.py; registers read from the cubin where NVRTC's log has none: cubin.py), the driver API and each launch (runtime.py, launch.py), cuBLAS as the baseline
(baseline.py), checking against float64 (verify.py), timing (bench.py) and Nsight Compute
(profile.py). Only this stage and what builds on it needs a GPU (NVRTC does not).
"""
