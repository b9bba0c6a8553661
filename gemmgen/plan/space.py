"""Expand a spec's search sets into concrete points and prune the impossible ones with the Plan."""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass, field

from . import Plan, try_plan
from ..language.spec import Spec


# Settings added after tuning databases were first recorded: at these values they leave a point's
# key as it was, so the records of earlier searches still match the same kernels. `round nearest tma`
# (the default) keys as the truncating kernels did before it: the kernel is the same but for its A and
# B tensor maps' data type, TFLOAT32 for FLOAT32, and ran as fast (H100, 43ed7b0, every TMA member of
# the tf32 library: benchmarks/rounding/2026-11-26-h100-43ed7b0-tma-rounding.json).
LATER_DEFAULTS = {"load.A.via": "copy", "load.B.via": "copy", "unroll": 0, "round": "nearest",
                  "round.by": "tma"}
# A point's label marks the fills other than the path's own: stages=4a (async), stages=4c (copy).
FILL_MARKS = {"async": "a", "copy": "c"}


def point_key(spec: Spec) -> str:
    """A stable short id of a concrete point: its settings, not where they were written."""
    values = {key: spec.param(key).values[0] for key in spec.params}
    text = ";".join(f"{key}={values[key]}" for key in sorted(values)
                    if LATER_DEFAULTS.get(key, object()) != values[key])
    return hashlib.sha256(f"{spec.name}|{text}".encode()).hexdigest()[:16]


def describe(spec: Spec) -> str:
    """The values that vary in a search, as 'block=128x128x16 warp=64x32 ...'."""
    v = spec.__getitem__
    if v("decode.columns"):  # the decode kernel (plan/decode.py) has no tiles: its own three numbers
        occupancy = f" occ={v('occupancy')}" if v("occupancy") else ""
        math = f" math={v('math')}" if v("math") != "simt" else ""
        return f"decode={v('decode.columns')}x{v('decode.warps')}x{v('decode.slices')}{math}{occupancy}"
    parts = [f"block={v('block.m')}x{v('block.n')}x{v('block.k')}"]
    if spec.written("warp.m"):
        parts.append(f"warp={v('warp.m')}x{v('warp.n')}")
    if v("math") == "simt":
        parts.append(f"thread={v('thread.m')}x{v('thread.n')}r{v('repeat.m')}x{v('repeat.n')}")
    else:  # the MMA instruction takes the place of the thread tile
        parts.append(f"math={v('math')}")
        if spec.written("mma.m"):
            parts.append(f"mma={v('mma.m')}x{v('mma.n')}x{v('mma.k')}")
        if v("math") == "tf32" and (v("round"), v("round.by")) != ("nearest", "tma"):
            parts.append(f"round={v('round.by') if v('round') == 'nearest' else 'truncate'}")
    parts.append(f"vec=A{v('load.A.vector')}B{v('load.B.vector')}")
    via = "".join(op for op in "AB" if v(f"load.{op}.via") == "registers")
    if via:
        parts.append(f"via-registers={via}")
    parts.append(f"stages={v('stages')}{FILL_MARKS.get(v('stages.fill'), '')}")
    parts.append(f"frag={v('fragments')}")
    if v("unroll"):
        parts.append(f"unroll={v('unroll')}")
    if v("raster.group") > 1:
        parts.append(f"group={v('raster.group')}")
    if v("occupancy"):
        parts.append(f"occ={v('occupancy')}")
    if v("split") > 1:
        parts.append(f"split={v('split')}" + ("" if v("split.by") == "atomic" else "-" + v("split.by")))
    if v("schedule") != "data-parallel":
        parts.append(f"schedule={v('schedule')}")
    if v("cluster.m") * v("cluster.n") > 1:
        parts.append(f"cluster={v('cluster.m')}x{v('cluster.n')}")
    if v("promote"):
        parts.append(f"promote={v('promote')}")
    if v("epilogue.staged"):
        parts.append("staged")
    return " ".join(parts)


@dataclass
class Space:
    """The points of a search space that the Plan accepts, and why the others were dropped.

    A point is a tuple of values, one per dimension (a setting that holds a set), in the
    order of `keys`; `dimensions` lists each one's candidate values in the spec's order.
    """

    spec: Spec
    keys: list[str] = field(default_factory=list)
    dimensions: list[list] = field(default_factory=list)
    total: int = 0
    plan_at: dict[tuple, Plan] = field(default_factory=dict)
    pruned: Counter = field(default_factory=Counter)

    @property
    def valid(self) -> int:
        return len(self.plan_at)

    @property
    def valid_points(self) -> list[tuple]:
        return list(self.plan_at)

    @property
    def plans(self) -> list[Plan]:
        return list(self.plan_at.values())


# Points a search space may hold: each is planned when the space is expanded (20 to 100 us each),
# so this bounds expanding to seconds; the largest shipped space holds 82,944.
MAX_POINTS = 200_000


def size(spec: Spec) -> int:
    """The number of points of `spec`: the product of its sets' sizes (1 for a kernel)."""
    return math.prod(len(spec.params[key].values) for key in spec.set_keys)


def check_size(spec: Spec, limit: int = MAX_POINTS, what: str = "") -> int:
    """`spec`'s number of points, or a SpecError at its largest set when that is over `limit`:
    counted before a single point is made. `what` says what the space is, for the message
    (default: "kernel 'NAME'")."""
    points = size(spec)
    if points <= limit:
        return points
    keys = spec.set_keys
    largest = max(keys, key=lambda key: len(spec.params[key].values))  # the first of the largest
    factors = " x ".join(str(len(spec.params[key].values)) for key in keys)
    raise spec.error(largest, f"{what or f'kernel {spec.name!r}'} is a search space of {points:,} points "
                     f"({factors} values in its {len(keys)} sets), over the limit of {limit:,}",
                     f"at most {limit:,} points: fewer values in the sets (this one has "
                     f"{len(spec.params[largest].values)}), or several smaller spaces")


def expand(spec: Spec, limit: int = MAX_POINTS) -> Space:
    """Every point of `spec`'s sets, planned; impossible points counted by reason. A space of
    more than `limit` points is a SpecError, raised before any point is made."""
    check_size(spec, limit)
    keys = spec.set_keys
    space = Space(spec, keys, [list(spec.params[k].values) for k in keys])
    seen = set()
    for coords, point in zip(itertools.product(*space.dimensions), spec.points()):
        space.total += 1
        plan, error = try_plan(point)
        if plan is None:
            space.pruned[re.split(r"[(:;]", re.sub(r"\d+", "N", error.message))[0].strip()] += 1
            continue
        key = point_key(point)
        if key not in seen:
            seen.add(key)
            space.plan_at[coords] = plan
    return space


def to_text(spec: Spec, name: str | None = None, comment: str = "") -> str:
    """A concrete point written back as spec text, every setting explicit."""
    v = spec.__getitem__
    onoff = lambda flag: " transpose" if flag else ""  # noqa: E731
    lines = [f"# {line}" for line in comment.splitlines()]
    lines.append(f"kernel {name or spec.name} {{")
    lines.append(f"  target   {v('target')}")
    lines.append(f"  layout   A {v('layout.A')}, B {v('layout.B')}, C {v('layout.C')}")
    if v("decode.columns"):  # the decode kernel: its own line, and nothing of the tiled paths
        lines.append(f"  decode   columns {v('decode.columns')} warps {v('decode.warps')} slices {v('decode.slices')}")
        if v("math") != "simt":
            lines.append(f"  math     {v('math')}")
        if v("occupancy"):
            lines.append(f"  occupancy {v('occupancy')}")
        lines.append(f"  epilogue {'alpha beta' if v('epilogue.beta') else 'alpha'}")
        return "\n".join(lines + ["}"]) + "\n"
    lines.append(f"  block    {v('block.m')} x {v('block.n')} x {v('block.k')}")
    if spec.written("warp.m"):
        lines.append(f"  warp     {v('warp.m')} x {v('warp.n')}")
    if v("math") == "simt":
        lines.append(f"  thread   {v('thread.m')} x {v('thread.n')} repeat {v('repeat.m')} x {v('repeat.n')}")
    else:
        lines.append(f"  math     {v('math')}")
        if spec.written("mma.m"):
            lines.append(f"  mma      {v('mma.m')} x {v('mma.n')} x {v('mma.k')}")
        if v("round") == "truncate":
            lines.append("  round    truncate")
        elif v("round.by") != "tma":
            lines.append(f"  round    nearest {v('round.by')}")
    if v("order") != "n":
        lines.append(f"  order    {v('order')}")
    if not v("shared"):
        lines.append("  shared   off")
    else:
        for op in "AB":
            lines.append(f"  load {op}   vector {v(f'load.{op}.vector')}{onoff(v(f'load.{op}.transpose'))}"
                         + (" uncoalesced" if v(f"load.{op}.uncoalesced") else "")
                         + (" via registers" if v(f"load.{op}.via") == "registers" else ""))
        for op in "AB":
            mode = v(f"shared.{op}")
            if mode == "pad":
                lines.append(f"  shared {op} pad {v(f'shared.{op}.pad')}")
            elif mode == "swizzle":
                lines.append(f"  shared {op} swizzle xor")
        lines.append(f"  stages   {v('stages')} {v('stages.fill')}")
        if v("fragments") != 1:
            lines.append(f"  fragments {v('fragments')}")
        if v("unroll"):
            lines.append(f"  unroll   {v('unroll')}")
    lines.append(f"  raster   {'row' if v('raster.group') == 1 else 'group %d' % v('raster.group')}")
    if v("occupancy"):
        lines.append(f"  occupancy {v('occupancy')}")
    if v("split") > 1:
        lines.append(f"  split    {v('split')}" + ("" if v("split.by") == "atomic" else " " + v("split.by")))
    if v("schedule") != "data-parallel":
        lines.append(f"  schedule {v('schedule')}")
    if v("cluster.m") * v("cluster.n") > 1:
        lines.append(f"  cluster  {v('cluster.m')} x {v('cluster.n')}")
    if v("promote"):
        lines.append(f"  promote  {v('promote')}")
    lines.append(f"  epilogue {'alpha beta' if v('epilogue.beta') else 'alpha'}{' staged' if v('epilogue.staged') else ''}")
    if v("reduce.count"):
        lines.append(f"  reduce   min {v('reduce.count')}")
    lines.append("}")
    return "\n".join(lines) + "\n"
