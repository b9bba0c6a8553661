"""A Llama-like transformer in FP32 through PyTorch and through gemmgen, timed in turns, with its
errors against float64.

    python benchmarks/torch_model.py --out model.json           # the default model, about 1 min on an H100
    python benchmarks/torch_model.py --out m.json --layers 2 --hidden 512 --ffn 1408 --vocab 8000

The model is built from torch.nn alone: token embeddings, then decoder blocks (RMSNorm, causal
self-attention with rotary position embeddings and F.scaled_dot_product_attention, RMSNorm, a
SwiGLU MLP), a final RMSNorm and an output projection; every Linear is bias-free, as in Llama
(7 per block and the output: 57 GEMMs a forward at the default 8 layers). Defaults: hidden 2048,
FFN 5632, 8 layers, 16 heads, batch 4 x 512 tokens, vocabulary 32000, FP32.

One model object runs in four modes, in turns, with the same weights:
- pytorch-fp32: torch.backends.cuda.matmul.allow_tf32 = False (cudnn too): cuBLAS FP32;
- pytorch-tf32: allow_tf32 = True;
- gemmgen-fp32 / gemmgen-tf32: gemmgen.torch.use_gemmgen(model, precision) routes every
  nn.Linear through gemmgen (undone after each turn); allow_tf32 as the precision says, for what
  is left to PyTorch.

For each mode:
- errors against float64, first, from the initial weights: a deep copy of the model cast to
  float64 runs the same tokens on the same GPU; the logits (relative Frobenius error), the loss
  (relative error) and the gradients of one backward (relative error over all parameters as one
  vector) are compared;
- forward time (under torch.no_grad) and a training step's time (forward, cross-entropy loss,
  backward, AdamW step; one optimizer, built before any routing, serves every mode), each by CUDA
  events after warm-up (the first gemmgen calls compile their kernels), medians over --repeats
  rounds in which every mode takes one turn;
- Python's full (generation 2) collections that fell in each mode's timed work
  (`full_collections_timed`): one costs about 0.1 s over the ~315,000 objects such a process
  tracks. At 9d75c37 a run made about 5 and gemmgen tf32's steps spread over 50-126 ms; at e04e419
  none fell in any mode's timed work (a step makes no collection); the count says which rounds met one;
- the speed over PyTorch FP32 and over PyTorch TF32.

Writes JSON (device, driver, torch version, commit, date, settings, results) to --out and prints
a markdown table. `--device cpu` is a dry run of the script itself (no GPU numbers).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import math
import statistics
import sys
import warnings
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from torch_records import (compile_libraries, elapsed_ms, meta, refuse_to_overwrite, relative_error, table,
                           use_device, write_record)

import gemmgen.torch as gtorch
from gemmgen.gpu.runtime import ShapeError

MODES = ("pytorch-fp32", "pytorch-tf32", "gemmgen-fp32", "gemmgen-tf32")


@dataclass(frozen=True)
class Config:
    vocab: int = 32000
    hidden: int = 2048
    ffn: int = 5632
    layers: int = 8
    heads: int = 16
    batch: int = 4
    seq: int = 512
    rope_theta: float = 10000.0
    eps: float = 1e-6
    init_std: float = 0.02


# --- the model --------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, over the last dimension."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.heads, self.head_dim = config.heads, config.hidden // config.heads
        self.q_proj = nn.Linear(config.hidden, config.hidden, bias=False)
        self.k_proj = nn.Linear(config.hidden, config.hidden, bias=False)
        self.v_proj = nn.Linear(config.hidden, config.hidden, bias=False)
        self.o_proj = nn.Linear(config.hidden, config.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape

        def heads(t):  # (batch, seq, hidden) -> (batch, heads, seq, head_dim)
            return t.view(batch, seq, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(batch, seq, hidden))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: Config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden, config.ffn, bias=False)
        self.up_proj = nn.Linear(config.hidden, config.ffn, bias=False)
        self.down_proj = nn.Linear(config.ffn, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden, config.eps)
        self.attention = Attention(config)
        self.mlp_norm = RMSNorm(config.hidden, config.eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Tokens (batch, seq) -> logits (batch, seq, vocab)."""

    def __init__(self, config: Config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab, config.hidden)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden, config.eps)
        self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False)
        head_dim = config.hidden // config.heads
        inverse = 1.0 / config.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(config.seq, dtype=torch.float64), inverse)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)
        for module in self.modules():  # Llama's initialisation
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=config.init_std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        cos, sin = self.cos[:seq], self.sin[:seq]
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm_head(self.norm(x))


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_batch(config: Config, device: torch.device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens (batch, seq + 1): the inputs, and the next tokens as targets."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.randint(config.vocab, (config.batch, config.seq + 1), generator=generator).to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


# --- modes --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def mode(model: nn.Module, name: str):
    """The model runs as `name` inside the block: TF32 allowed or not, routed through gemmgen or not."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    tf32 = name.endswith("tf32")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    routing = gtorch.use_gemmgen(model, "tf32" if tf32 else "fp32") if name.startswith("gemmgen") else None
    try:
        yield routing
    finally:
        if routing is not None:
            routing.undo()
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


# --- errors against float64 ---------------------------------------------------------------------------

def float64_reference(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> dict:
    """The logits, loss and gradients of a float64 copy of the model (left unchanged) on these tokens."""
    reference = copy.deepcopy(model).double()
    logits = reference(inputs)
    loss = loss_of(logits, targets)
    loss.backward()
    found = {"logits": logits.detach(), "loss": loss.item(), "grads": [p.grad for p in reference.parameters()]}
    del reference
    return found


def errors(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, reference: dict) -> dict:
    """One forward and backward of the model as it runs now, against the float64 reference; the
    gradients are cleared again."""
    model.zero_grad(set_to_none=True)
    logits = model(inputs)
    loss = loss_of(logits, targets)
    loss.backward()
    difference = total = 0.0
    for parameter, expected in zip(model.parameters(), reference["grads"]):
        difference += (parameter.grad.double() - expected).norm().item() ** 2
        total += expected.norm().item() ** 2
    found = {"logits_error": relative_error(logits.detach(), reference["logits"]), "loss": loss.item(),
             "loss_error": abs(loss.item() - reference["loss"]) / abs(reference["loss"]),
             "grad_error": math.sqrt(difference / total)}
    model.zero_grad(set_to_none=True)
    return found


# --- timing -------------------------------------------------------------------------------------------

def forward(model, inputs):
    with torch.no_grad():
        model(inputs)


@contextlib.contextmanager
def counting_full_collections():
    """[n]: the full (generation 2) collections Python's collector made inside the block."""
    counted = [0]

    def callback(phase, info):
        if phase == "stop" and info["generation"] == 2:
            counted[0] += 1

    gc.callbacks.append(callback)
    try:
        yield counted
    finally:
        gc.callbacks.remove(callback)


def train_step(model, optimizer, inputs, targets):
    optimizer.zero_grad(set_to_none=True)
    loss_of(model(inputs), targets).backward()
    optimizer.step()


def run(args) -> dict:
    device = torch.device(args.device)
    use_device(device)
    precisions = sorted({name.split("-")[1] for name in args.modes if name.startswith("gemmgen")})
    if args.precompile:
        compile_libraries(precisions, device)
    config = Config(vocab=args.vocab, hidden=args.hidden, ffn=args.ffn, layers=args.layers, heads=args.heads,
                    batch=args.batch, seq=args.seq)
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = Transformer(config)
    inputs, targets = make_batch(config, device, args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)  # before any routing: the same Parameters
    parameters = sum(p.numel() for p in model.parameters())
    print(f"model: {config.layers} layers, hidden {config.hidden}, FFN {config.ffn}, {config.heads} heads, "
          f"vocab {config.vocab}, {parameters / 1e6:.1f}M parameters; batch {config.batch} x {config.seq} tokens",
          flush=True)

    noted: list[str] = []
    results = {name: {"mode": name} for name in args.modes}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reference = float64_reference(model, inputs, targets)
        for name in args.modes:  # errors first, from the initial weights; the first gemmgen calls compile
            with mode(model, name) as routing:
                results[name].update(errors(model, inputs, targets, reference))
                results[name]["gemmgen_layers"] = len(routing.routed) if routing else 0
            print(f"{name}: errors measured", flush=True)
        del reference
        if device.type == "cuda":
            torch.cuda.empty_cache()
        for name in args.modes:  # warm-up
            with mode(model, name):
                for _ in range(args.warmup):
                    forward(model, inputs)
                    train_step(model, optimizer, inputs, targets)
        times = {name: {"forward": [], "step": []} for name in args.modes}
        full = {name: 0 for name in args.modes}
        for _ in range(args.repeats):  # in turns
            for name in args.modes:
                with mode(model, name):
                    with counting_full_collections() as counted:
                        times[name]["forward"].append(elapsed_ms(lambda: forward(model, inputs), device))
                        times[name]["step"].append(elapsed_ms(lambda: train_step(model, optimizer, inputs, targets),
                                                              device))
                    full[name] += counted[0]
    for warning in caught:
        text = f"{warning.category.__name__}: {warning.message}"
        if text not in noted:
            noted.append(text)
            print(f"warning: {text}", file=sys.stderr)

    for name in args.modes:
        found = results[name]
        for what in ("forward", "step"):
            found[f"{what}_ms"] = statistics.median(times[name][what])
            found[f"{what}_ms_all"] = times[name][what]
        found["full_collections_timed"] = full[name]
        for baseline in ("pytorch-fp32", "pytorch-tf32"):
            if baseline in results:
                for what in ("forward", "step"):
                    found[f"{what}_x_{baseline[8:]}"] = (statistics.median(times[baseline][what])
                                                        / found[f"{what}_ms"])
    settings = {**asdict(config), "dtype": "float32", "repeats": args.repeats, "warmup": args.warmup,
                "optimizer": f"AdamW(lr={args.lr})", "seed": args.seed, "parameters": parameters,
                "forward": "under torch.no_grad", "timing": "CUDA events, median over rounds in turns"}
    return {"benchmark": "torch_model", "meta": meta(args.commit, device), "settings": settings,
            "results": [results[name] for name in args.modes], "warnings": noted}


def markdown(record: dict) -> str:
    def ratio(row, key):
        return f"{row[key]:.2f}" if key in row else "-"

    rows = [[row["mode"], f"{row['forward_ms']:.2f}", ratio(row, "forward_x_fp32"), ratio(row, "forward_x_tf32"),
             f"{row['step_ms']:.2f}", ratio(row, "step_x_fp32"), ratio(row, "step_x_tf32"),
             f"{row['logits_error']:.2e}", f"{row['loss_error']:.2e}", f"{row['grad_error']:.2e}"]
            for row in record["results"]]
    header = ["mode", "forward ms", "x PyTorch FP32", "x PyTorch TF32", "training step ms", "x PyTorch FP32",
              "x PyTorch TF32", "logits error", "loss error", "gradient error"]
    m, s = record["meta"], record["settings"]
    return (f"{s['layers']} layers, hidden {s['hidden']}, FFN {s['ffn']}, {s['heads']} heads, vocab {s['vocab']}, "
            f"batch {s['batch']} x {s['seq']}, FP32, on {m['device']} (driver {m.get('driver')}), torch "
            f"{m['torch']}, commit {m['commit']}, {m['date']}; medians of {s['repeats']} rounds in turns; "
            f"errors against the model in float64 (relative; gradients over all parameters):\n\n"
            + table(header, rows))


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write the record to")
    parser.add_argument("--force", action="store_true", help="replace --out even if gemmgen did not write it")
    parser.add_argument("--commit", help="the commit to record (default: $GEMMGEN_COMMIT, else git's HEAD)")
    for name, default in (("vocab", 32000), ("hidden", 2048), ("ffn", 5632), ("layers", 8), ("heads", 16),
                          ("batch", 4), ("seq", 512)):
        parser.add_argument(f"--{name}", type=int, default=default, help=f"default {default}")
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds, every mode once a round (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed forwards and steps per mode first (default 2)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--no-precompile", dest="precompile", action="store_false",
                        help="compile gemmgen's kernels on first use rather than all at once, in parallel, first")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a dry run")
    args = parser.parse_args(argv)
    for name in ("vocab", "hidden", "ffn", "layers", "heads", "batch", "seq", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    if args.hidden % args.heads or (args.hidden // args.heads) % 2:
        parser.error(f"--hidden {args.hidden} must be --heads {args.heads} times an even head size")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        parser.error("torch sees no CUDA GPU (--device cpu runs the script dry)")
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    refuse_to_overwrite(args.out, args.force)
    try:
        record = run(args)
    except (ShapeError, FileNotFoundError) as exc:  # gemmgen's reasons (a library missing, say)
        sys.exit(f"error: {exc}")
    write_record(args.out, record)
    print("\n" + markdown(record) + f"\n\nwrote {args.out}")
    return record


if __name__ == "__main__":
    main()
