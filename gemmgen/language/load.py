"""Spec text and files to Specs: the entry points (parse, parse_file, load, load_file, load_one) and
the kernels' `extends`, resolved within a file and across the NAME.gemm files beside it, bounded
in depth, files and bytes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from lark import Token

from .errors import Span, SpecError
from .spec import MAX_SPEC_BYTES, Param, ParsedFile, Spec
from .syntax import USAGE, _check_values, _kernel_source, _library, _span, _statements
from .textfile import FileRefused, read_text


def read_spec_text(path: Path) -> str:
    """A spec file's text: a regular file (not a pipe or a device, which would block or never
    end), its size checked before it is read (a SpecError past MAX_SPEC_BYTES), UTF-8 with or
    without a byte-order mark. Raises SpecError, or OSError as opening does, for the caller to word."""
    return read_text(path, MAX_SPEC_BYTES, "a spec", "a kernel is a few lines")


def parse(text: str, path: str = "<spec>", *, search_dirs: tuple[Path, ...] = ()) -> list[Spec]:
    """All kernels of a spec text, parents merged in. Raises SpecError, nothing else."""
    return parse_file(text, path, search_dirs=search_dirs).kernels


def parse_file(text: str, path: str = "<spec>", *, search_dirs: tuple[Path, ...] = ()) -> ParsedFile:
    """The kernels (parents merged in) and libraries of a spec text. Raises SpecError only."""
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some editors write
    kernels, trees = _statements(text, path)
    libraries = [_library(tree, text, path) for tree in trees]
    if not kernels and not libraries:
        raise SpecError("the spec defines no kernel", path=path, text=text,
                        span=Span(1, 1, 2), allowed=USAGE["kernel"])
    names = [str(k[0]) for k in kernels] + [lib.name for lib in libraries]
    for library in libraries:
        if names.count(library.name) > 1:
            raise SpecError(f"'{library.name}' names both a library and another definition in this file",
                            path=path, text=text, span=library.span, allowed="one definition per name")
    loader = _Loader(tuple(search_dirs), len(text.encode()))
    file = _KernelFile(kernels, text, path, loader)
    if not path.startswith("<"):
        loader.files[Path(path).resolve()] = file  # a parent's parent may be in this file
    return ParsedFile([file.resolve(name) for name in file.pending], libraries)


# Kernels a kernel may have above it through `extends` (its parent, the parent's parent, ...): a
# chain longer than a few is a mistake, and each step costs a file read and a parse.
MAX_EXTENDS_DEPTH = 32
EXTENDS_LIMIT = f"at most {MAX_EXTENDS_DEPTH} kernels above a kernel through `extends`"
# Files a spec may read, its own among them (each at most MAX_SPEC_BYTES), and bytes in all.
MAX_SPEC_FILES = 64
MAX_LOAD_BYTES = 4 * MAX_SPEC_BYTES


@dataclass
class _Loader:
    """What one parse has read: each file a kernel extends from, parsed once (by resolved path),
    the kernels whose parents are being resolved (one chain of `extends`, to find a loop or a
    chain past MAX_EXTENDS_DEPTH), and the bytes read."""

    search_dirs: tuple[Path, ...]
    bytes_read: int
    files: dict[Path, "_KernelFile"] = field(default_factory=dict)
    chain: list[tuple["_KernelFile", str]] = field(default_factory=list)

    def file_with(self, parent: Token, child: "_KernelFile") -> "_KernelFile":
        """The file NAME.gemm beside `child`'s file (or in a search folder) defining the kernel
        NAME that `parent` names; a SpecError at `parent` when there is none or it cannot be read."""
        name = str(parent)

        def error(message: str, allowed: str) -> SpecError:
            return SpecError(message, path=child.path, text=child.text, span=_span(parent), allowed=allowed)

        dirs = list(self.search_dirs)
        if not child.path.startswith("<"):
            dirs.insert(0, Path(child.path).parent)
        for directory in dirs:
            candidate = directory / f"{name}.gemm"
            if not candidate.is_file():
                continue
            key = candidate.resolve()
            if key not in self.files:
                if len(self.files) >= MAX_SPEC_FILES:
                    raise error(f"kernel extends '{name}' from {candidate}, but this spec has read "
                                f"{MAX_SPEC_FILES} files already, gemmgen's limit",
                                f"kernels whose parents lie in at most {MAX_SPEC_FILES} files")
                try:
                    text = read_spec_text(candidate)
                except SpecError as exc:
                    raise error(f"cannot read {candidate}: {exc.message}", "a NAME.gemm spec file") from None
                except OSError as exc:
                    raise error(f"cannot read {candidate}: {exc.strerror}", "a readable NAME.gemm file") from None
                self.bytes_read += len(text.encode())
                if self.bytes_read > MAX_LOAD_BYTES:
                    raise error(f"kernel extends '{name}' from {candidate}, but this spec and the files "
                                f"of its parents would be more than {MAX_LOAD_BYTES / 1e6:g} MB in all",
                                f"a spec and parents of at most {MAX_LOAD_BYTES / 1e6:g} MB in all")
                kernels, _ = _statements(text, str(candidate))  # a parent file's libraries are not read
                self.files[key] = _KernelFile(kernels, text, str(candidate), self)
            if name in self.files[key].pending:
                return self.files[key]
        raise error(f"kernel extends '{name}', which is neither in this file nor in {name}.gemm beside it",
                    "the name of a kernel in this file or a NAME.gemm file next to it")


class _KernelFile:
    """The kernels of one file as written (each setting once), resolved on demand: each kernel once,
    its parents merged in, whether they are in this file or in another."""

    def __init__(self, kernels: list, text: str, path: str, loader: _Loader):
        self.text, self.path, self.loader = text, path, loader
        self.specs: dict[str, Spec] = {}
        self.pending: dict[str, tuple] = {}
        for name_token, parent, span, meta, statements in kernels:
            name = str(name_token)
            if name in self.pending:
                raise SpecError(f"kernel '{name}' is defined twice in this file", path=path, text=text,
                                span=_span(name_token), allowed="one kernel per name")
            params: dict[str, Param] = {}
            first_seen: dict[str, Span] = {}
            for stmt in statements:
                _check_values(stmt, path, text)
                for key, value in stmt.params.items():
                    if key in first_seen:
                        raise SpecError(
                            f"'{stmt.keyword}' sets {key} again (first set at line {first_seen[key].line})",
                            path=path, text=text, span=stmt.span, allowed="each setting once per kernel")
                    first_seen[key] = stmt.span
                    params[key] = Param(value.values, value.span)
            self.pending[name] = (name_token, parent, span, meta, params)

    def _error(self, token: Token, message: str, allowed: str) -> SpecError:
        return SpecError(message, path=self.path, text=self.text, span=_span(token), allowed=allowed)

    def resolve(self, name: str) -> Spec:
        if name in self.specs:
            return self.specs[name]
        name_token, parent, span, meta, params = self.pending[name]
        merged: dict[str, Param] = {}
        depth = 0
        if parent is not None:
            chain = self.loader.chain
            chain.append((self, name))
            try:
                parent_spec = self._parent(parent)
            finally:
                chain.pop()
            depth = parent_spec.depth + 1
            if depth > MAX_EXTENDS_DEPTH:
                raise self._error(parent, f"kernel '{name}' extends '{parent}', which has {parent_spec.depth} "
                                  "kernels above it through `extends` already, gemmgen's limit", EXTENDS_LIMIT)
            if parent_spec.path == self.path:
                merged.update(parent_spec.params)
            else:  # spans of the parent's own settings point into the parent's file
                merged.update({key: p if p.origin else replace(p, origin=(parent_spec.path, parent_spec.text))
                               for key, p in parent_spec.params.items()})
        merged.update(params)
        spec = Spec(name=name, params=merged, path=self.path, text=self.text, span=_span(name_token),
                    parent=str(parent) if parent is not None else None,
                    source=_kernel_source(self.text, meta), depth=depth)
        self.specs[name] = spec
        return spec

    def _parent(self, parent: Token) -> Spec:
        """The resolved parent kernel that `parent` names (the chain ends with its child)."""
        chain = self.loader.chain
        name = chain[-1][1]
        if len(chain) > MAX_EXTENDS_DEPTH:
            top_file, top = chain[0]
            raise self._error(parent, f"kernel '{name}' extends '{parent}': the chain of `extends` from "
                              f"kernel '{top}' ({top_file.path}) goes past {MAX_EXTENDS_DEPTH} kernels "
                              "above it, gemmgen's limit", EXTENDS_LIMIT)
        parent_name = str(parent)
        file = self if parent_name in self.pending else self.loader.file_with(parent, self)
        if (file, parent_name) in chain:
            loop = chain[chain.index((file, parent_name)):]
            if all(f is self for f, _ in loop):
                raise self._error(parent, f"kernel '{name}' extends itself through "
                                  f"{' -> '.join(n for _, n in loop)}", "a chain without loops")
            files = " -> ".join(Path(f.path).name for f, _ in loop + [(file, parent_name)])
            kernels = " -> ".join(n for _, n in loop + [(file, parent_name)])
            raise self._error(parent, f"kernel '{name}' extends '{parent_name}' from {file.path}, whose "
                              f"parents lead back to it ({files}: kernels {kernels})",
                              "a chain of files without loops")
        return file.resolve(parent_name)


def load(path: str | Path) -> list[Spec]:
    """The kernels (and search spaces) of a spec file."""
    return load_file(path).kernels


def load_file(path: str | Path) -> ParsedFile:
    """The kernels and libraries of a spec file."""
    path = Path(path)
    try:
        text = read_spec_text(path)
    except FileRefused as exc:
        if exc.reason != "not regular":
            raise
        raise SpecError(f"cannot read spec: {exc.message}", path=str(path), allowed=exc.allowed) from None
    except OSError as exc:
        raise SpecError(f"cannot read spec: {exc.strerror}", path=str(path)) from None
    return parse_file(text, str(path))


def load_one(path: str | Path, name: str | None = None) -> Spec:
    """The kernel `name` of a spec file (or its only kernel)."""
    specs = load(path)
    if name is None:
        if len(specs) > 1:
            names = ", ".join(s.name for s in specs)
            raise SpecError(f"the file defines several kernels ({names}); name one", path=str(path),
                            allowed=names)
        return specs[0]
    for spec in specs:
        if spec.name == name:
            return spec
    raise SpecError(f"no kernel named '{name}' in this file", path=str(path),
                    allowed=", ".join(s.name for s in specs))
