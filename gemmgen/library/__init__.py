"""Libraries: one GEMM entry point per precision over several tuned kernels. A library block is resolved,
tuned and turned into a manifest (tune.py), its member chosen per call by a fitted model
(selection.py), emitted as one .cu, and called from Python as gemmgen.matmul (dispatch.py), the
operands' layouts routed to the library that serves them (layouts.py).
"""
