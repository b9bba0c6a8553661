"""Libraries: one GEMM entry point per precision over several tuned kernels. What a library is and
what its database holds (model.py); a library block resolved (resolve.py), tuned on the GPU
(tune.py) and built into a manifest (manifest.py) and one .cu with its header (emit.py); the member
chosen per call by a fitted model (selection.py); gemmgen.matmul, the library called from Python
(dispatch.py), the operands' layouts routed to the library that serves them (layouts.py) and a
batched call's leading dimensions turned into one strided launch (batches.py).
"""
