"""One GEMM split over several GPUs of a host, the copies overlapping the kernels: the split and
resident shards (split.py), what to cut and where as pure functions (parts.py), a split prepared
once per call key (prepared.py) and issued in rounds from the calling thread (fanout.py), the devices
through CuPy and the CUDA runtime (cupy_layer.py), the links between them (topology.py), and how it
scales against one GPU (scaling.py).
"""
