"""What a library is: its members and candidate kernels (Library, Member, resolved by resolve.py),
the database keys of a candidate and a shape, what the database holds of it on one device
(read_db, Measurements), and the choice of the members it keeps from those measurements."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..explain.analysis import occupancy
from ..gpu.compile import compile_plan
from ..language.shapes import LibraryShape
from ..language.spec import LibrarySpec, Spec
from ..plan import Plan
from ..plan.space import point_key
from ..tuning import database as tuning_db
from .selection import MemberShape, alignment_class, decode_shaped, ffma_decode, tight_leading_dimensions

MANIFEST_FORMAT = 1
EXHAUSTIVE_LIMIT = 64      # a space with more valid points is searched per shape by a strategy
WINNERS_PER_SHAPE = 3      # candidates a searched space gives per shape
MAX_MEMBERS = 20           # kernels a library keeps (each costs compile time and .cu size) ...
GAIN_PER_SHAPE = 0.001     # ... while one more gains at least this (0.1%) a tuned shape, on average
MAX_LISTED_MEMBERS = 64    # members a library may name (each is found, and its points planned)
PRECISION_OF_MATH = {"simt": "fp32", "3xtf32": "fp32", "tf32": "tf32"}
PRECISION_WORDS = {"fp32": "FP32-accurate (math simt or 3xtf32)", "tf32": "TF32 (math tf32)"}


@dataclass
class Member:
    """A member as the library uses it: its spec in the library's layouts, and its valid points."""

    name: str
    spec: Spec
    plans: list[Plan]
    searched: bool   # a space too large to time whole: a strategy searches it per shape


@dataclass
class Library:
    spec: LibrarySpec
    members: list[Member]
    precision: str

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def layouts(self) -> dict[str, str]:
        return self.spec.layouts()

    @property
    def shapes(self) -> list[LibraryShape]:
        return list(dict.fromkeys(self.spec.shapes))

    @property
    def baseline(self) -> str:
        return "cuBLAS TF32" if self.precision == "tf32" else "cuBLAS FP32"

    def candidates(self) -> list[Plan]:
        """Every kernel the library times whole: concrete members and the points of small spaces,
        each once."""
        seen, plans = set(), []
        for member in self.members:
            if member.searched:
                continue
            for plan in member.plans:
                if kernel_key(plan) not in seen:
                    seen.add(kernel_key(plan))
                    plans.append(plan)
        return plans


def kernel_key(plan: Plan) -> str:
    """The database key of a candidate: its settings, whatever member or library it came from."""
    return point_key(replace(plan.spec, name="kernel"))


def shape_key(shape: LibraryShape) -> str:
    """The database's key of a library's shape: MxNxK, *B for a batch, +P when padded."""
    return tuning_db.shape_key(shape.M, shape.N, shape.K, shape.pad, shape.batch)


def measured_at(shape: LibraryShape, layouts: dict[str, str]) -> tuple:
    """The key of a shape's measurement in a member's data (selection.fit_all): (M, N, K, class),
    with the batch after for a strided batch."""
    key = (shape.M, shape.N, shape.K, shape_class(shape, layouts))
    return key if shape.batch == 1 else (*key, shape.batch)


def read_db(db: Path, library: str) -> dict[str, dict[str, dict]]:
    """This library's records by device: {device|driver: {what|key: record}} (later lines win).
    Raises tuning_db.DatabaseError (file:line) for a malformed database."""
    by_device: dict[str, dict[str, dict]] = {}
    for _, entry in tuning_db.read(db):
        scope = tuning_db.Scope.of(entry)
        if scope.owner == library:
            by_device.setdefault(scope.device_key, {})[f"{scope.what}|{entry['key']}"] = entry
    return by_device


@dataclass
class Measurements:
    """What the database holds for one device: validation status and times per (candidate, shape)."""

    status: dict[str, dict] = field(default_factory=dict)       # kernel key -> validation record
    times: dict[tuple[str, str], float] = field(default_factory=dict)  # (kernel key, shape key) -> ms
    cublas: dict[str, float] = field(default_factory=dict)      # shape key -> ms

    @classmethod
    def of(cls, records: dict[str, dict]) -> "Measurements":
        m = cls()
        for label, entry in records.items():
            what, key = label.split("|")
            if what == "device":
                continue
            if what == "validation":
                m.status[key] = entry
            elif entry.get("status") == "ok":
                if key == "cublas":
                    m.cublas[what] = entry["ms"]
                else:
                    m.times[(key, what)] = entry["ms"]
            else:  # a crash or timeout while timing: the candidate is out
                m.status[key] = entry
        return m

    def valid(self, key: str) -> bool:
        return self.status.get(key, {}).get("status") == "ok"


def member_shape(plan: Plan, slots_per_sm: int = 1) -> MemberShape:
    return MemberShape(plan.BM, plan.BN, plan.BK, plan.split_k, slots_per_sm, plan.schedule == "stream-k",
                       plan.cluster_m, plan.cluster_n, plan.path == "decode",
                       plan.mainloop.products if plan.path == "decode" else 0)


def slots_per_sm(plan: Plan) -> int:
    """Blocks of this kernel an SM holds at once (ptxas's registers, the Plan's shared memory)."""
    if plan.mainloop.owns_sm:  # a wgmma block takes a whole SM (__launch_bounds__(THREADS, 1))
        return 1
    resources = max(compile_plan(plan).resources.values(), key=lambda r: r.registers)
    return max(1, occupancy(plan, resources).blocks)


def shape_class(shape: LibraryShape, layouts: dict[str, str]) -> str:
    lda, ldb, ldc = tight_leading_dimensions(shape.M, shape.N, shape.K, layouts, shape.pad)
    return alignment_class(lda, ldb, ldc)


def portable_member(plan: Plan) -> bool:
    """Whether a member can serve every call on any GPU: no wgmma (sm_90a only), takes beta, and not
    the decode kernel (built for M or N <= 16 alone)."""
    return not plan.arch.has_wgmma and plan.beta and plan.path != "decode"


def may_take(plan: Plan, shape: LibraryShape, ffma: bool, exact_rows: int, decode_only: bool = False) -> bool:
    """Whether the choice may take the candidate at a tuned shape: at most `exact_rows` rows, where the
    library has an FFMA decode candidate (`ffma`), only those (selection.short_sum_call); where
    `decode_only` (selection.decode_call), only decode candidates."""
    member = member_shape(plan)
    return (not (ffma and 0 < shape.M <= exact_rows) or ffma_decode(member)) and (not decode_only or member.decode)


def decode_only_at(plans: list[Plan], shape: LibraryShape, layouts: dict[str, str]) -> bool:
    """selection.decode_call at a tuned shape: a call of few columns or few rows (selection.decode_shaped)
    and a decode candidate among `plans`."""
    return decode_shaped(shape.M, shape.N, shape_class(shape, layouts)) and any(p.path == "decode" for p in plans)


def allowed_times(plans: list[Plan], m: Measurements, shapes: list[LibraryShape], exact_rows: int = 0,
                  layouts: dict[str, str] | None = None) -> list[list[float | None]]:
    """times[i][j]: plan i's time at shape j where it was timed and the choice may take it there
    (may_take: at most `exact_rows` rows, FFMA decode candidates only; with `layouts`, decode_only_at),
    else None. What select_members and tuning's specialists compare."""
    ffma = any(ffma_decode(member_shape(p)) for p in plans)
    decode_only = [layouts is not None and decode_only_at(plans, s, layouts) for s in shapes]
    return [[m.times.get((kernel_key(plan), shape_key(s))) if may_take(plan, s, ffma, exact_rows, only) else None
             for s, only in zip(shapes, decode_only)] for plan in plans]


def select_members(plans: list[Plan], m: Measurements, shapes: list[LibraryShape], limit: int,
                   exact_rows: int = 0, layouts: dict[str, str] | None = None) -> list[Plan]:
    """Greedy: add the candidate that most lowers the sum over shapes of log(kept best / best), where
    a shape no kept candidate was timed at counts as 4x slower; stop at `limit` or when nothing
    gains GAIN_PER_SHAPE (0.1%) a shape. Always keeps a portable candidate (portable_member). At a
    shape of at most `exact_rows` rows only the candidates the choice may take there count
    (selection.short_sum_call: FFMA sums), and with `layouts`, at an aligned shape of few columns only
    the decode candidates (selection.decode_call)."""
    keys = [shape_key(s) for s in shapes]
    times = allowed_times(plans, m, shapes, exact_rows, layouts)
    best = [min((row[j] for row in times if row[j] is not None), default=None) for j in range(len(keys))]

    def cost(kept_best: list[float | None]) -> float:
        return sum(math.log(t / b) if t is not None else math.log(4.0)
                   for t, b in zip(kept_best, best) if b is not None)

    def with_plan(kept_best: list[float | None], i: int) -> list[float | None]:
        return [t if u is None else u if t is None else min(t, u) for t, u in zip(kept_best, times[i])]

    kept: list[Plan] = []
    kept_best: list[float | None] = [None] * len(keys)  # the kept candidates' best time at each shape
    current = cost(kept_best)
    while len(kept) < limit:
        options = [(cost(with_plan(kept_best, i)), i) for i, p in enumerate(plans) if p not in kept and p.beta]
        if not options:
            break
        value, index = min(options)
        if kept and current - value < GAIN_PER_SHAPE * len(keys):
            break
        kept.append(plans[index])
        kept_best = with_plan(kept_best, index)
        current = value
    if not any(portable_member(p) for p in kept):
        portable = [p for p in plans if portable_member(p)]
        if portable:
            kept.append(max(portable, key=lambda p: (sum((kernel_key(p), k) in m.times for k in keys),
                                                     -plans.index(p))))
    return kept
