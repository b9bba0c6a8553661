"""What the parts add to a kernel's launch: extra kernel parameters (C declaration, launcher
argument and the kind gemmgen/launch.py lays out), in one description that the kernel template,
the C launcher and the Python launch all read."""

from __future__ import annotations

from dataclasses import dataclass

# kind -> (C type in the kernel's declaration, how the C launcher passes a local of that name)
_C = {"t": ("const __grid_constant__ TensorMap", "TensorMap", "*reinterpret_cast<const TensorMap*>(&{})"),
      "p": ("float* __restrict__", "float*", "{}")}


@dataclass(frozen=True)
class Parameter:
    """A kernel parameter a part adds after the main ones: `kind` as gemmgen/launch.py's KINDS
    (t: a CUtensorMap, p: a pointer)."""

    name: str
    kind: str

    @property
    def declaration(self) -> str:
        return f"{_C[self.kind][0]} {self.name}"

    @property
    def type(self) -> str:
        return _C[self.kind][1]

    @property
    def argument(self) -> str:
        return _C[self.kind][2].format(self.name)
