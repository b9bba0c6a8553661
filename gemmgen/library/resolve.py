"""A library block resolved: its members found (in the spec's file or NAME.gemm beside it), sized before
a point is made, planned in the library's layouts, and checked against each other (one precision, a
member that takes beta, one that runs on every GPU), every problem a SpecError at its line."""

from __future__ import annotations

from pathlib import Path

from ..language.errors import SpecError
from ..language.load import load_file
from ..language.spec import LibrarySpec, Spec
from ..plan import try_plan
from ..plan.space import MAX_POINTS, check_size
from .model import (EXHAUSTIVE_LIMIT, MAX_LISTED_MEMBERS, MAX_MEMBERS, PRECISION_OF_MATH, PRECISION_WORDS, Library,
                    Member)


def _find_member(name: str, span, lib: LibrarySpec, kernels: list[Spec]) -> Spec:
    for spec in kernels:
        if spec.name == name:
            return spec
    if not lib.path.startswith("<"):
        candidate = Path(lib.path).parent / f"{name}.gemm"
        if candidate.is_file():
            for spec in load_file(candidate).kernels:
                if spec.name == name:
                    return spec
            raise lib.error(span, f"{candidate} defines no kernel named '{name}'",
                            "the name of a kernel in that file")
    raise lib.error(span, f"member '{name}' is neither a kernel in this file nor in {name}.gemm beside it",
                    "the name of a kernel or search space in this file or a NAME.gemm next to it")


def _sized(lib: LibrarySpec, kernels: list[Spec]) -> list[tuple[str, object, Spec]]:
    """The members found, each in the library's layouts, their points counted (not made): a member
    over MAX_POINTS is a SpecError at its largest set, and so are members of more than MAX_POINTS
    in all (at the first member past it)."""
    if len(lib.members) > MAX_LISTED_MEMBERS:
        name, span = lib.members[MAX_LISTED_MEMBERS]
        raise lib.error(span, f"library '{lib.name}' names {len(lib.members)} members, more than "
                        f"{MAX_LISTED_MEMBERS}", f"at most {MAX_LISTED_MEMBERS} members (it keeps {MAX_MEMBERS})")
    layouts = lib.layouts()
    found, total = [], 0
    for name, span in lib.members:
        spec = _find_member(name, span, lib, kernels)
        spec = spec.with_values(layout_A=layouts["A"], layout_B=layouts["B"], layout_C=layouts["C"])
        total += check_size(spec, what=f"member '{name}' of library '{lib.name}'")
        if total > MAX_POINTS:
            raise lib.error(span, f"the members of library '{lib.name}' up to '{name}' hold {total:,} points "
                            f"in all, over the limit of {MAX_POINTS:,}",
                            f"members of at most {MAX_POINTS:,} points in all: smaller search spaces")
        found.append((name, span, spec))
    return found


def resolve(lib: LibrarySpec, kernels: list[Spec]) -> Library:
    """The library's members found, planned in its layouts and checked against each other."""
    layouts = lib.layouts()
    members: list[Member] = []
    precision_source: tuple[str, str] | None = None
    if lib.precision:
        precision_source = (lib.precision[0], "the library's precision line")
    for name, span, spec in _sized(lib, kernels):
        maths = spec.param("math").values
        decode_simt = precision_source[0] if precision_source else PRECISION_OF_MATH["simt"]
        if spec.param("decode.columns").values != (0,):
            # the decode kernel (M or N <= 16) multiplies in exact FP32 at HBM bandwidth under math simt: it
            # serves a TF32 library too, at no cost (memory bound) and more accurately than TF32
            classes = {decode_simt if m == "simt" else PRECISION_OF_MATH[m] for m in maths}
        else:
            classes = {PRECISION_OF_MATH[m] for m in maths}
        if len(classes) > 1:
            raise lib.error(span, f"member '{name}' mixes math {', '.join(maths)}: TF32 and FP32-accurate "
                            "kernels cannot share a library", "members of one precision: math tf32, or math simt/3xtf32")
        (precision,) = classes
        if precision_source and precision != precision_source[0]:
            raise lib.error(span, f"member '{name}' is {PRECISION_WORDS[precision]}, but {precision_source[1]} "
                            f"is {PRECISION_WORDS[precision_source[0]]}: a library keeps to one precision",
                            f"members of {PRECISION_WORDS[precision_source[0]]}")
        precision_source = precision_source or (precision, f"member '{name}'")
        plans, reasons = [], []
        for point in spec.points():
            plan, error = try_plan(point)
            if plan is None:
                reasons.append(error.message)
                continue
            if plan.reduce_count:
                raise lib.error(span, f"member '{name}' fuses a reduction, whose entry point takes more "
                                "arguments than a library's", "kernels without a reduce line")
            if plan.epilogue.fused:
                raise lib.error(span, f"member '{name}' fuses an epilogue ({plan.epilogue.formula}), which a "
                                "library's entry point does not take", "kernels without bias, scale or activation lines")
            if plan.truncates:
                raise lib.error(span, f"member '{name}' truncates A and B to TF32 (round truncate), where a "
                                "library's TF32 members round to nearest as cuBLAS does: truncation has about "
                                "2.6x its error", "members that round: no round line (TMA rounds as it copies), "
                                "or stages N tma / async")
            plans.append(plan)
        if not plans:
            raise lib.error(span, f"member '{name}' cannot be built in this library's layout (A {layouts['A']}, "
                            f"B {layouts['B']}, C {layouts['C']}): {reasons[0] if reasons else 'no valid point'}",
                            "members that take the library's layout (stages N async and mma.sync take any)")
        members.append(Member(name, spec, plans, len(plans) > EXHAUSTIVE_LIMIT))
    library = Library(lib, members, precision_source[0])
    plans = [plan for m in members for plan in m.plans]
    if not any(plan.beta for plan in plans):
        raise lib.error(None, f"no member of library '{lib.name}' takes beta != 0 (all have 'epilogue alpha'): "
                        "it could not serve every call", "at least one member with epilogue alpha beta")
    if not any(not plan.arch.has_wgmma and plan.beta for plan in plans):
        raise lib.error(None, f"every member of library '{lib.name}' needs sm_90a (wgmma): on any other GPU "
                        "it would have no kernel", "a portable member: a kernel whose target is sm_80 to sm_90, "
                        "with epilogue alpha beta")
    return library


def load_libraries(path: str | Path, name: str | None = None) -> list[Library]:
    """The libraries of a spec file, resolved (only `name` when given)."""
    parsed = load_file(path)
    chosen = [lib for lib in parsed.libraries if name is None or lib.name == name]
    if name is not None and not chosen:
        raise SpecError(f"no library named '{name}' in this file", path=str(path),
                        allowed=", ".join(lib.name for lib in parsed.libraries) or "(this file has none)")
    return [resolve(lib, parsed.kernels) for lib in chosen]
