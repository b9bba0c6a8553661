"""The units of GPU work of every tuning (a search, a library): a Job says what to do with a candidate
(validate it, time it at a shape, or both) or with cuBLAS (time it at a shape), and which record of
the database its result becomes; Device is what a GPU worker reports of its GPU."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..gpu.verify import Case
from ..plan import Plan
from .database import VALIDATION, Scope

MEASURE = "measure"      # validate on awkward small shapes, then time at the shape (a search's point)
VALIDATE = "validate"    # validate only (a library's candidate, once)
TIME = "time"            # time at the shape (a library's candidate that passed validation)
BASELINE = "baseline"    # time cuBLAS at the shape, in the candidates' precision
KINDS = (MEASURE, VALIDATE, TIME, BASELINE)


@dataclass(frozen=True)
class Device:
    """A GPU as its worker reports it: what a record's scope names, and what models need."""

    name: str
    driver: str
    sm_count: int
    compute_capability: tuple[int, int]


@dataclass(frozen=True)
class Job:
    """One unit of GPU work and the record it becomes: {"scope": device|driver|what|owner, "key",
    "point", then the measurer's fields (status, ms, tflops or reason)}."""

    kind: str                        # one of KINDS
    key: str                         # the record's key: the candidate's, or CUBLAS_KEY
    point: str                       # the record's label: describe() of the candidate, or the baseline's name
    what: str                        # the scope's third field: the shape's key, or VALIDATION
    owner: str                       # the scope's fourth: the search space or library
    plan: Plan | None = field(default=None, compare=False)
    source: str | None = field(default=None, compare=False)  # generated source, patched (None: generate)
    shape: Case | None = None        # where it is timed: M, N, K and the leading dimensions' pad
    layouts: tuple[tuple[str, str], ...] = ()  # a baseline's operand layouts (a candidate's are its plan's)
    budget_s: float = 0.2            # timing: seconds of timed launches
    warmup_s: float | None = None    # timing: seconds of warm-up (None: gpu.bench's default)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a job of kind {self.kind!r}: one of {', '.join(KINDS)}")
        if (self.kind == BASELINE) == (self.plan is not None):
            raise ValueError("a baseline job holds no plan, and every other job one")
        if (self.kind == VALIDATE) != (self.what == VALIDATION) or (self.kind != VALIDATE and self.shape is None):
            raise ValueError(f"a {self.kind} job is recorded at {'validation' if self.kind == VALIDATE else 'a shape'}")

    def scope(self, device: Device) -> Scope:
        return Scope(device.name, device.driver, self.what, self.owner)

    def record(self, device: Device, fields: dict) -> dict:
        """The database record of this job's result on `device`."""
        return {"scope": str(self.scope(device)), "key": self.key, "point": self.point, **fields}

    @property
    def doing(self) -> str:
        """What the job was doing, for a reason: "time at 64x64x64", "validate"."""
        return self.kind if self.kind == VALIDATE else f"{self.kind} at {self.what}"
