"""Code generation: a Plan lowered to CUDA C through the Jinja templates (cuda.py: the kernel and its
extern "C" launcher) and the C/C++ header beside it (c_header.py). No compiler and no GPU here.
"""
