"""The PyTorch stage: gemmgen's libraries as a differentiable PyTorch operator.

    import gemmgen.torch                               # registers torch.ops.gemmgen.matmul
    y = gemmgen.torch.matmul(x, w.t())                 # FP32-accurate, differentiable
    y = gemmgen.torch.matmul(x, w.t(), 0.5, "tf32")    # alpha, precision
    y = torch.ops.gemmgen.matmul(x, w.t())             # the same operator

matmul(a, b, alpha=1.0, precision="fp32") -> Tensor
    alpha * a @ b for float32 CUDA matrices a (M x K) and b (K x N), as a new row-major M x N
    tensor on a's device and PyTorch's current stream. `precision` is "fp32" (as accurate as FP32:
    3xTF32 tensor-core kernels) or "tf32" (inputs rounded to TF32, about 1e-3 relative error).
    a and b may be any views with a unit stride: a transposed weight (w.t()) or activation is read
    in place, never copied (a view with no unit stride is copied, and a warning says so once).
    Parameters and tensors that require grad are taken as they are. Batches (..., M, K) @
    (..., K, N) broadcast as torch.matmul's: one strided-batched launch (library/batches.py). A 1-D
    a or b is a row or a column, as in torch.matmul (W @ x with x of shape (K,) has shape (M,)).

Autograd: grad_a = alpha * grad @ b.T and grad_b = alpha * a.T @ grad, each computed by this
operator in the same precision on transposed views (only the gradients an input needs).
torch.compile(fullgraph=True) traces it, forward and backward, without a graph break (a fake
implementation gives shapes without running anything), and CUDA graphs capture and replay it.

linear(x, weight, bias=None, activation=None, precision="fp32") -> Tensor  (fused.py; also gemmgen.linear)
    act(x @ weight^T + bias) with F.linear's shapes, the bias and the activation ("relu", "gelu",
    "gelu_tanh", "silu") in the GEMM's store: one pass over the output where PyTorch makes three.
    torch.ops.gemmgen.linear is its operator. Differentiable (the activation's backward is PyTorch's).

For out=, beta, a column-major output or a stream of your choosing, without autograd, use
gemmgen.matmul(A, B, out, alpha=, beta=, precision=, stream=), which takes the same fast path.

Models (nn.py):

    layer = gemmgen.torch.Linear(1024, 4096, device="cuda")     # nn.Linear through gemmgen
    routing = gemmgen.torch.use_gemmgen(model, "fp32")          # every nn.Linear of a model, in place
    routing.undo()                                              # (or: with use_gemmgen(model): ...)

Linear is an nn.Linear (same parameters, initialisation and state_dict) whose forward runs
x @ weight^T through the operator for any leading batch dimensions, then adds the bias.
use_gemmgen keeps every module and Parameter object (an optimizer built before it keeps working),
leaves the layers it cannot take to PyTorch with their reasons (Routing.skipped), and undoes.
"""

from .fused import linear, linear_op
from .nn import Linear, Routing, use_gemmgen
from .ops import matmul, matmul_op

__all__ = ["Linear", "Routing", "linear", "linear_op", "matmul", "matmul_op", "use_gemmgen"]
