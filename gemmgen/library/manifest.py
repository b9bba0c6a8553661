"""A library's manifest: the candidates it keeps, each one's fitted model, the tuned table and the
leave-one-out quality of its choice, built from the database with no GPU; and the manifest read back
(its members planned, their models as candidates of selection.choose). emit.py turns a manifest
into one .cu with a single extern "C" entry point; dispatch.py loads one to choose and launch from
Python."""

from __future__ import annotations

from pathlib import Path

from ..language.load import parse
from ..plan import Plan, make_plan
from ..plan.space import describe, to_text
from .model import (MANIFEST_FORMAT, MAX_MEMBERS, Library, Measurements, kernel_key, member_shape, read_db,
                    select_members, shape_class, shape_key, slots_per_sm)
from .selection import Candidate, MemberShape, Model, choose, fit_all, leave_one_out


def build_manifest(library: Library, db: Path, *, device: str | None = None,
                   max_members: int = MAX_MEMBERS) -> dict:
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
    # keeps everywhere), so that each member's model and the table rest on complete data.
    complete = [p for p in plans if all((kernel_key(p), shape_key(s)) in m.times for s in shapes)]
    kept = select_members(complete if len(complete) >= 2 else plans, m, shapes, max_members)
    sm_count = _sm_count(by_device[device])
    slots = {kernel_key(p): slots_per_sm(p) for p in kept}
    member_shapes = [member_shape(p, slots[kernel_key(p)]) for p in kept]
    data = [{(s.M, s.N, s.K, shape_class(s, layouts)): m.times[(kernel_key(p), shape_key(s))]
             for s in shapes if (kernel_key(p), shape_key(s)) in m.times} for p in kept]
    models = fit_all(member_shapes, data, sm_count)
    flags = [(p.beta, p.arch.has_wgmma) for p in kept]
    loo = leave_one_out(member_shapes, data, sm_count, flags)
    members = []
    for index, (plan, shape, per_class) in enumerate(zip(kept, member_shapes, models)):
        name = f"{library.name}_{index}"
        members.append({
            "name": name, "key": kernel_key(plan), "point": describe(plan.spec),
            "member": plan.spec.name, "spec": to_text(plan.spec, name, f"member {plan.spec.name} of library "
                                                      f"{library.name}: {describe(plan.spec)}"),
            "target": plan.arch.name, "math": plan.math, "BM": shape.BM, "BN": shape.BN, "BK": shape.BK,
            "split": shape.split, "slots_per_sm": shape.slots_per_sm,
            **({"stream_k": True} if shape.stream_k else {}),
            **({"cluster": [shape.cluster_m, shape.cluster_n]} if shape.cluster_m * shape.cluster_n > 1 else {}),
            "beta": plan.beta,
            "needs_sm90a": plan.arch.has_wgmma,
            "models": {cls: model.to_dict() if model else None for cls, model in per_class.items()},
        })
    table = []
    for s in shapes:
        times = {str(i): m.times[(kernel_key(p), shape_key(s))] for i, p in enumerate(kept)
                 if (kernel_key(p), shape_key(s)) in m.times}
        candidates = [Candidate(ms, {c: x for c, x in pc.items()}, beta=f[0], needs_sm90a=f[1])
                      for ms, pc, f in zip(member_shapes, models, flags)]
        cls = shape_class(s, layouts)
        chosen = choose(candidates, s.M, s.N, s.K, cls, sm_count)
        best_any = min((m.times[(kernel_key(p), shape_key(s))] for p in plans
                        if (kernel_key(p), shape_key(s)) in m.times), default=None)
        table.append({"M": s.M, "N": s.N, "K": s.K, "pad": s.pad, "class": cls,
                      "cublas_ms": m.cublas.get(shape_key(s)), "chosen": chosen, "ms": times,
                      "best_candidate_ms": best_any})
    device_name, driver = device.split("|")
    portable = next(i for i, p in enumerate(kept) if not p.arch.has_wgmma and p.beta) \
        if any(not p.arch.has_wgmma and p.beta for p in kept) else None
    return {
        "generator": "gemmgen", "format": MANIFEST_FORMAT, "library": library.name, "precision": library.precision,
        "baseline": library.baseline, "layout": layouts,
        "device": {"name": device_name, "driver": driver, "sm_count": sm_count,
                   "compute_capability": _compute_capability(kept)},
        "members": members, "portable": portable, "shapes": table,
        "leave_one_out": {"median": loo.median, "worst": loo.worst,
                          "per_shape": {f"{M}x{N}x{K} {cls}": r for (M, N, K, cls), r in loo.ratios.items()}},
        "candidates_timed": len(plans),
    }


def _sm_count(records: dict[str, dict]) -> int:
    for entry in records.values():
        if "sm_count" in entry:
            return entry["sm_count"]
    return 132


def _compute_capability(plans: list[Plan]) -> list[int]:
    """The compute capability the library was tuned for: sm_90a members pin it to 9.0."""
    wgmma = [p for p in plans if p.arch.has_wgmma]
    return list(wgmma[0].arch.compute_capability) if wgmma else list(plans[0].arch.compute_capability)


def member_plans(manifest: dict) -> list[Plan]:
    """The kept members of a manifest, planned from the spec text it carries."""
    plans = []
    for member in manifest["members"]:
        (spec,) = parse(member["spec"], f"<library {manifest['library']}: {member['name']}>")
        plans.append(make_plan(spec))
    return plans


def candidates_of(manifest: dict) -> list[Candidate]:
    return [Candidate(MemberShape(m["BM"], m["BN"], m["BK"], m["split"], m["slots_per_sm"], m.get("stream_k", False),
                                  *m.get("cluster", (1, 1))),
                      {cls: Model.from_dict(d) if d else None for cls, d in m["models"].items()},
                      beta=m["beta"], needs_sm90a=m["needs_sm90a"]) for m in manifest["members"]]
