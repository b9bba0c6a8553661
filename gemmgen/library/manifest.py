"""A library's manifest: the candidates it keeps, each one's fitted model, the tuned table and the
leave-one-out quality of its choice, built from the database with no GPU (build_manifest); typed
(Manifest and its parts), written and read back as the JSON file beside the library's .cu
(to_json and from_json keep that file byte for byte); its members planned and its models made
candidates of selection.choose. emit.py turns a manifest into one .cu with a single extern "C"
entry point; dispatch.py loads one to choose and launch from Python."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..language.load import parse
from ..language.shapes import LibraryShape
from ..plan import Plan, make_plan
from ..plan.parts.decode import PRODUCTS
from ..plan.space import describe, to_text
from .model import (MANIFEST_FORMAT, MAX_MEMBERS, Library, Measurements, kernel_key, measured_at, member_shape,
                    decode_only_at, may_take, portable_member, read_db, select_members, shape_class, shape_key, slots_per_sm)
from .selection import (Candidate, MemberShape, Model, choose, ffma_decode, fit_all, leave_one_out, measured_key,
                        serves, short_sum_rows)


class ManifestError(ValueError):
    """A file that is no library manifest gemmgen can read: the message names it."""


@dataclass
class TunedDevice:
    """The GPU a library was tuned on."""

    name: str
    driver: str
    sm_count: int
    compute_capability: list[int]

    def to_dict(self) -> dict:
        return {"name": self.name, "driver": self.driver, "sm_count": self.sm_count,
                "compute_capability": list(self.compute_capability)}


@dataclass
class ManifestMember:
    """A kernel the library keeps: its spec text, its tiling and its fitted models per class."""

    name: str             # its launcher is gemmgen_<name>
    key: str              # the candidate's key in the database
    point: str            # describe() of its settings
    member: str           # the library member (kernel or search space) it came from
    spec: str             # the spec text it is planned from
    target: str
    math: str
    BM: int
    BN: int
    BK: int
    split: int
    slots_per_sm: int
    beta: bool
    needs_sm90a: bool
    models: dict[str, Model | None]
    stream_k: bool = False
    cluster: tuple[int, int] = (1, 1)
    decode: bool = False  # the decode kernel (M or N <= 16)

    @property
    def shape(self) -> MemberShape:
        return MemberShape(self.BM, self.BN, self.BK, self.split, self.slots_per_sm, self.stream_k, *self.cluster,
                           self.decode, PRODUCTS.get(self.math, 0) if self.decode else 0)

    def candidate(self) -> Candidate:
        return Candidate(self.shape, dict(self.models), beta=self.beta, needs_sm90a=self.needs_sm90a)

    def to_dict(self) -> dict:
        data = {"name": self.name, "key": self.key, "point": self.point, "member": self.member, "spec": self.spec,
                "target": self.target, "math": self.math, "BM": self.BM, "BN": self.BN, "BK": self.BK,
                "split": self.split, "slots_per_sm": self.slots_per_sm}
        if self.stream_k:
            data["stream_k"] = True
        if tuple(self.cluster) != (1, 1):
            data["cluster"] = list(self.cluster)
        if self.decode:
            data["decode"] = True
        data.update(beta=self.beta, needs_sm90a=self.needs_sm90a,
                    models={cls: model.to_dict() if model else None for cls, model in self.models.items()})
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "ManifestMember":
        fields = {k: data[k] for k in ("name", "key", "point", "member", "spec", "target", "math", "BM", "BN",
                                       "BK", "split", "slots_per_sm", "beta", "needs_sm90a")}
        return cls(**fields, models={c: Model.from_dict(m) if m else None for c, m in data["models"].items()},
                   stream_k=bool(data.get("stream_k", False)), cluster=tuple(data.get("cluster", (1, 1))),
                   decode=bool(data.get("decode", False)))


@dataclass
class TunedShape:
    """A row of the tuned table: a shape, cuBLAS there, the member chosen and the members' times."""

    M: int
    N: int
    K: int
    pad: int
    klass: str                   # alignment class ("aligned", "split", "unaligned"); "class" in the file
    cublas_ms: float | None
    chosen: int                  # index of the member the choice takes here
    ms: dict[int, float]         # member index -> measured ms (the members timed here)
    best_candidate_ms: float | None  # the fastest candidate timed here that the choice may take, kept or not
    batch: int = 1                   # a strided batch of this many matrices

    @property
    def key(self) -> str:
        """MxNxK, *batch for a strided batch, +pad when padded (the database's shape key)."""
        return shape_key(LibraryShape(self.M, self.N, self.K, self.pad, batch=self.batch))

    @property
    def chosen_ms(self) -> float | None:
        return self.ms.get(self.chosen)

    def to_dict(self) -> dict:
        data = {"M": self.M, "N": self.N, "K": self.K, "pad": self.pad, "class": self.klass,
                "cublas_ms": self.cublas_ms, "chosen": self.chosen, "ms": {str(i): t for i, t in self.ms.items()},
                "best_candidate_ms": self.best_candidate_ms}
        return data if self.batch == 1 else {**data, "batch": self.batch}

    @classmethod
    def from_dict(cls, data: dict) -> "TunedShape":
        return cls(data["M"], data["N"], data["K"], data["pad"], data["class"], data["cublas_ms"], data["chosen"],
                   {int(i): t for i, t in data["ms"].items()}, data["best_candidate_ms"], data.get("batch", 1))


@dataclass
class LeaveOneOutQuality:
    """The choice's quality over the tuned shapes: chosen without a shape's data / best there."""

    median: float
    worst: float
    per_shape: dict[str, float]  # "MxNxK class" -> ratio

    def to_dict(self) -> dict:
        return {"median": self.median, "worst": self.worst, "per_shape": dict(self.per_shape)}


@dataclass
class Manifest:
    """A library as tuned on one device: what its .cu, header and gemmgen.matmul are made from."""

    library: str
    precision: str                 # "fp32" or "tf32"
    baseline: str                  # the cuBLAS mode it was timed against
    layout: dict[str, str]         # {"A": "row", "B": "col", "C": "row"}
    device: TunedDevice
    members: list[ManifestMember]
    portable: int | None           # the member that runs on any GPU (None: none was kept)
    shapes: list[TunedShape]
    leave_one_out: LeaveOneOutQuality
    candidates_timed: int
    database: str | None = None    # the database it was built from, as the command was given it
    generator: str = "gemmgen"
    format: int = MANIFEST_FORMAT
    _plans: list[Plan] | None = field(default=None, repr=False, compare=False)

    @property
    def portable_index(self) -> int:
        """The member a GPU the library was not tuned for runs (the first when none is portable)."""
        return self.portable if self.portable is not None else 0

    def plans(self) -> list[Plan]:
        """The kept members, planned from the spec text they carry (once)."""
        if self._plans is None:
            self._plans = []
            for member in self.members:
                (spec,) = parse(member.spec, f"<library {self.library}: {member.name}>")
                self._plans.append(make_plan(spec))
        return self._plans

    def candidates(self) -> list[Candidate]:
        """The members as selection.choose takes them."""
        return [member.candidate() for member in self.members]

    def to_dict(self) -> dict:
        data = {"generator": self.generator, "format": self.format, "library": self.library,
                "precision": self.precision, "baseline": self.baseline, "layout": dict(self.layout),
                "device": self.device.to_dict(), "members": [m.to_dict() for m in self.members],
                "portable": self.portable, "shapes": [s.to_dict() for s in self.shapes],
                "leave_one_out": self.leave_one_out.to_dict(), "candidates_timed": self.candidates_timed}
        if self.database is not None:
            data["database"] = self.database
        return data

    def to_json(self) -> str:
        """The manifest file's text."""
        return json.dumps(self.to_dict(), indent=1) + "\n"

    @classmethod
    def from_dict(cls, data: dict, origin: str = "<manifest>") -> "Manifest":
        try:
            if not isinstance(data, dict) or data.get("generator") != "gemmgen":
                raise ManifestError("no generator 'gemmgen'")
            if data.get("format") != MANIFEST_FORMAT:
                raise ManifestError(f"format {data.get('format')!r}; this gemmgen reads format {MANIFEST_FORMAT}")
            device = data["device"]
            loo = data["leave_one_out"]
            return cls(data["library"], data["precision"], data["baseline"], dict(data["layout"]),
                       TunedDevice(device["name"], device["driver"], device["sm_count"],
                                   list(device["compute_capability"])),
                       [ManifestMember.from_dict(m) for m in data["members"]], data["portable"],
                       [TunedShape.from_dict(s) for s in data["shapes"]],
                       LeaveOneOutQuality(loo["median"], loo["worst"], dict(loo["per_shape"])),
                       data["candidates_timed"], data.get("database"))
        except ManifestError as exc:
            raise ManifestError(f"{origin}: not a gemmgen library manifest: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            what = f"no field {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
            raise ManifestError(f"{origin}: not a gemmgen library manifest ({what}): build it again with "
                                "gemmgen build LIB.gemm --from-db DB") from None

    @classmethod
    def from_json(cls, text: str, origin: str = "<manifest>") -> "Manifest":
        """A manifest from its file's text; ManifestError, naming `origin`, for anything else."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ManifestError(f"{origin}: not a gemmgen library manifest (not JSON: {exc})") from None
        return cls.from_dict(data, origin)

    @classmethod
    def read(cls, path: str | Path) -> "Manifest":
        """The manifest in a file (OSError when it cannot be read)."""
        return cls.from_json(Path(path).read_text(), str(path))


def build_manifest(library: Library, db: Path, *, device: str | None = None,
                   max_members: int = MAX_MEMBERS) -> Manifest:
    """The library as measured on one device: its kept members with their models, the tuned table,
    and the leave-one-out quality of the choice. No GPU needed."""
    by_device = read_db(db, library.name)
    if not by_device:
        raise LookupError(f"{db} holds no measurements of library '{library.name}': run gemmgen tune on it")
    if device is None:
        device = max(by_device, key=lambda d: len(by_device[d]))
    elif device not in by_device:
        matches = [d for d in by_device if d.split("|")[0] == device]
        if not matches:
            raise LookupError(f"{db} has no measurements of '{library.name}' on {device}; it has: "
                              + ", ".join(by_device))
        device = matches[0]
    m = Measurements.of(by_device[device])
    plans = [p for p in library.candidates() if m.valid(kernel_key(p))]
    for member in library.members:  # winners of searched spaces that were timed as candidates
        if member.searched:
            plans += [p for p in member.plans if m.valid(kernel_key(p)) and
                      any((kernel_key(p), shape_key(s)) in m.times for s in library.shapes)]
    if not plans:
        raise LookupError(f"no candidate of library '{library.name}' passed validation on {device}")
    layouts = library.layouts
    shapes = [s for s in library.shapes if shape_key(s) in m.cublas or
              any((kernel_key(p), shape_key(s)) in m.times for p in plans)]
    # Members come from the candidates timed at every shape (tuning's last phase times those it
    # keeps everywhere), so that each member's model and the table rest on complete data (the decode
    # member: every shape it serves).
    complete = [p for p in plans if all((kernel_key(p), shape_key(s)) in m.times for s in shapes
                                        if serves(member_shape(p), s.M, s.N))]
    exact_rows = short_sum_rows(library.precision)
    kept = select_members(complete if len(complete) >= 2 else plans, m, shapes, max_members, exact_rows, layouts)
    sm_count = _sm_count(by_device[device])
    slots = {kernel_key(p): slots_per_sm(p) for p in kept}
    member_shapes = [member_shape(p, slots[kernel_key(p)]) for p in kept]
    data = [{measured_at(s, layouts): m.times[(kernel_key(p), shape_key(s))]
             for s in shapes if (kernel_key(p), shape_key(s)) in m.times} for p in kept]
    models = fit_all(member_shapes, data, sm_count)
    flags = [(p.beta, p.arch.has_wgmma) for p in kept]
    loo = leave_one_out(member_shapes, data, sm_count, flags, exact_rows)
    members = []
    for index, (plan, shape, per_class) in enumerate(zip(kept, member_shapes, models)):
        name = f"{library.name}_{index}"
        members.append(ManifestMember(
            name=name, key=kernel_key(plan), point=describe(plan.spec), member=plan.spec.name,
            spec=to_text(plan.spec, name, f"member {plan.spec.name} of library {library.name}: "
                                          f"{describe(plan.spec)}"),
            target=plan.arch.name, math=plan.math, BM=shape.BM, BN=shape.BN, BK=shape.BK, split=shape.split,
            slots_per_sm=shape.slots_per_sm, beta=plan.beta, needs_sm90a=plan.arch.has_wgmma,
            models=dict(per_class), stream_k=shape.stream_k, cluster=(shape.cluster_m, shape.cluster_n),
            decode=shape.decode))
    candidates = [Candidate(ms, dict(pc), beta=f[0], needs_sm90a=f[1])
                  for ms, pc, f in zip(member_shapes, models, flags)]
    table = []
    ffma = any(ffma_decode(member_shape(p)) for p in plans)
    for s in shapes:
        times = {i: m.times[(kernel_key(p), shape_key(s))] for i, p in enumerate(kept)
                 if (kernel_key(p), shape_key(s)) in m.times}
        cls = shape_class(s, layouts)
        best_any = min((m.times[(kernel_key(p), shape_key(s))] for p in plans
                        if (kernel_key(p), shape_key(s)) in m.times
                        and may_take(p, s, ffma, exact_rows, decode_only_at(kept, s, layouts))),
                       default=None)
        table.append(TunedShape(s.M, s.N, s.K, s.pad, cls, m.cublas.get(shape_key(s)),
                                choose(candidates, s.M, s.N, s.K, cls, sm_count, batch=s.batch, exact_rows=exact_rows), times, best_any,
                                s.batch))
    device_name, driver = device.split("|")
    portable = next((i for i, p in enumerate(kept) if portable_member(p)), None)
    return Manifest(
        library=library.name, precision=library.precision, baseline=library.baseline, layout=layouts,
        device=TunedDevice(device_name, driver, sm_count, _compute_capability(kept)),
        members=members, portable=portable, shapes=table,
        leave_one_out=LeaveOneOutQuality(loo.median, loo.worst, {_label(key): r for key, r in loo.ratios.items()}),
        candidates_timed=len(plans))


def loo_label(M: int, N: int, K: int, cls: str, batch: int = 1) -> str:
    """A leave-one-out ratio's shape: "MxNxK class", the batch after MxNxK as *B."""
    return f"{shape_key(LibraryShape(M, N, K, batch=batch))} {cls}"


def _label(key: tuple) -> str:
    return loo_label(*measured_key(key))


def _sm_count(records: dict[str, dict]) -> int:
    for entry in records.values():
        if "sm_count" in entry:
            return entry["sm_count"]
    return 132


def _compute_capability(plans: list[Plan]) -> list[int]:
    """The compute capability the library was tuned for: sm_90a members pin it to 9.0."""
    wgmma = [p for p in plans if p.arch.has_wgmma]
    return list(wgmma[0].arch.compute_capability) if wgmma else list(plans[0].arch.compute_capability)
