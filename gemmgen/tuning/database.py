"""The tuning database: JSON lines, one record per line, the one format of every tuning (a search,
a library, on one GPU, several, or a Dask cluster).

A record is {"scope": "device|driver|what|owner", "key": ..., then its fields}, the scope (Scope)
saying what the measurement depends on besides the candidate itself:

- device, driver: the GPU's name and the driver's version;
- what: a shape, `MxNxK`, or `MxNxK+P` when its leading dimensions are P floats past tight (a
  timing there, or why there is none); `validation` (a candidate checked on awkward small shapes,
  once per device); or `device` (the GPU's facts: sm_count, compute_capability);
- owner: the search space or library whose candidate it is.

The key is the candidate's (a search's point_key, a library's kernel_key), CUBLAS_KEY for the
baseline, DEVICE_KEY for the device's facts. The fields: "point" (the candidate's label,
describe()), "status" (ok, invalid, compile, crash, timeout or lost), "ms" and "tflops" of a
timing, "reason" of a failure, and "time" (seconds since 1970, set by `append`). A search records
a point's validation and timing in one record at its shape; a library validates a candidate once
(`validation`) and times it at many shapes.

`append` is the one writer, called only where the tuning runs (the workers never write: runner.py
and distributed.py hand it every result); `read` the one reader, used by every command that takes
a database (build --from-db, replay --db, tune --db, library tuning and building). `read` checks
each record before anything uses it and raises DatabaseError naming the file and line: a file that
is no database (random bytes, a JSON array, a FIFO, a file past MAX_BYTES), and records with a
malformed field (a time that is no number, a scope that is not device|driver|what|owner). The one
line it skips is one cut short by an interrupted append. Records of older gemmgen are migrated
as they are read (`migrate`): a library's first timings held ms alone, and get their TFLOP/s
from ms and the scope's shape. Nothing rewrites a file.

`check_labels` holds records to the points they name: a record stores a point's key (a hash of
its settings) and its label (`describe`). A label that contradicts its key's point means the line
was edited or mixed up, and the kernel built from it would not be the one it names: such a
database is refused (DatabaseError at the line), not skipped, since either field may be the
wrong one and a silently dropped fastest record changes what gets built. A label may be older
than today's `describe` (settings added since are missing from it): only settings both name are
compared, and flags and non-default values the label names that the point lacks.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..outputs import OutputError, real_path

MAX_BYTES = 256 << 20   # a database past this is no tuning database (~500,000 records)
VALIDATION = "validation"  # the scope's `what` of a candidate's validation
DEVICE = "device"          # the scope's `what` of the GPU's facts
NOT_A_SHAPE = (VALIDATION, DEVICE)  # scopes whose records hold no timing
CUBLAS_KEY = "cublas"      # the key of the baseline's timing
DEVICE_KEY = "device"      # the key of the GPU's facts
_SHAPE = re.compile(r"(\d+)x(\d+)x(\d+)(?:\*(\d+))?(?:\+(\d+))?$")
_DEFAULTS = {"group": "1", "occ": "0", "unroll": "0", "split": "1", "schedule": "data-parallel",
             "cluster": "1x1", "promote": "0"}  # settings describe() leaves out at these values


class DatabaseError(ValueError):
    """A tuning database that cannot be used: the message names the file (and line)."""


def shape_key(M: int, N: int, K: int, pad: int = 0, batch: int = 1) -> str:
    """A shape as a scope names it: MxNxK, *B for a strided batch of B such matrices, +P for leading
    dimensions P floats past tight."""
    return f"{M}x{N}x{K}" + (f"*{batch}" if batch != 1 else "") + (f"+{pad}" if pad else "")


@dataclass(frozen=True)
class Scope:
    """What a record's measurement depends on besides its candidate: device|driver|what|owner."""

    device: str
    driver: str
    what: str    # a shape key (MxNxK or MxNxK+P), VALIDATION or DEVICE
    owner: str   # the search space or library

    def __str__(self) -> str:
        return f"{self.device}|{self.driver}|{self.what}|{self.owner}"

    @classmethod
    def parse(cls, text: str) -> "Scope":
        """ValueError unless `text` is four non-empty fields joined by '|'."""
        parts = text.split("|") if isinstance(text, str) else []
        if len(parts) != 4 or not all(parts):
            raise ValueError(f"{json.dumps(text)[:80]}, not 'device|driver|shape|space'")
        return cls(*parts)

    @classmethod
    def of(cls, entry: dict) -> "Scope":
        """The scope of a record `read` returned."""
        return cls.parse(entry["scope"])

    @property
    def device_key(self) -> str:
        """device|driver: one GPU's records."""
        return f"{self.device}|{self.driver}"

    @property
    def shape(self) -> tuple[int, int, int, int, int] | None:
        """(M, N, K, pad, batch) of a timing's scope; None for validation, the device, or anything else."""
        found = _SHAPE.match(self.what)
        if not found:
            return None
        M, N, K, batch, pad = found.groups()
        return int(M), int(N), int(K), int(pad or 0), int(batch or 1)


def db_scope(device: str, driver: str, shape, owner: str) -> str:
    """The scope of a search's records at a shape (its M, N, K and batch: a search times tight leading
    dimensions)."""
    return str(Scope(device, driver, shape_key(shape.M, shape.N, shape.K, batch=shape.batch), owner))


def append(db: Path, entry: dict) -> None:
    """Add one record, flushed and synced. A line left cut short by an interrupted append stays
    a line of its own (a newline goes first), so that `read` can skip it alone."""
    entry = {**entry, "time": round(time.time(), 3)}
    with open(db, "a+b") as handle:
        handle.seek(0, os.SEEK_END)
        lead = b""
        if handle.tell():
            handle.seek(-1, os.SEEK_END)
            lead = b"" if handle.read(1) == b"\n" else b"\n"
        handle.write(lead + json.dumps(entry).encode() + b"\n")
        handle.flush()
        os.fsync(handle.fileno())


def _text(db: Path) -> str:
    try:
        info = os.stat(db)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise DatabaseError(f"cannot read the tuning database {db}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise DatabaseError(f"{db} is not a regular file: a tuning database is a file of JSON lines")
    if info.st_size > MAX_BYTES:
        raise DatabaseError(f"{db} is {info.st_size / 2**20:.0f} MiB, more than a tuning database holds "
                            f"({MAX_BYTES >> 20} MiB): is it the right file?")
    try:
        data = Path(db).read_bytes()
    except OSError as exc:
        raise DatabaseError(f"cannot read the tuning database {db}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise DatabaseError(f"{db}:{line}: not UTF-8 text: not a gemmgen tuning database "
                            "(JSON lines, one record per line)") from None


def _number(entry: dict, name: str, what: str) -> str | None:
    value = entry[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"'{name}' is {json.dumps(value)[:40]}, not a number ({what})"
    if not math.isfinite(value) or value < 0:
        return f"'{name}' is {value}, not a finite number >= 0 ({what})"
    return None


def problem(entry) -> str | None:
    """What is wrong with one parsed line as a record, or None."""
    if not isinstance(entry, dict):
        kind = {list: "array", str: "string", bool: "true or false", type(None): "null"}.get(type(entry), "number")
        return f"a JSON {kind}, not a record (a JSON object per line)"
    try:
        scope = Scope.parse(entry.get("scope"))
    except ValueError as exc:
        return f"'scope' is {exc}"
    if not isinstance(entry.get("key"), str) or not entry["key"]:
        return f"'key' is {json.dumps(entry.get('key'))[:40]}, not a point's key"
    for name in ("point", "status", "reason"):
        if name in entry and not isinstance(entry[name], str):
            return f"'{name}' is {json.dumps(entry[name])[:40]}, not a string"
    for name, what in (("ms", "milliseconds"), ("tflops", "TFLOP/s"), ("time", "seconds since 1970")):
        if name in entry and (why := _number(entry, name, what)):
            return why
    if entry.get("status") == "ok" and scope.what not in NOT_A_SHAPE and "ms" not in entry:
        return "a timing with status ok and no 'ms'"
    if "sm_count" in entry and (not isinstance(entry["sm_count"], int) or isinstance(entry["sm_count"], bool)
                                or entry["sm_count"] <= 0):
        return f"'sm_count' is {json.dumps(entry['sm_count'])[:40]}, not a count of SMs"
    cc = entry.get("compute_capability", [0, 0])
    if not (isinstance(cc, list) and len(cc) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                            and x >= 0 for x in cc)):
        return f"'compute_capability' is {json.dumps(cc)[:40]}, not [major, minor]"
    return None


def migrate(entry: dict) -> dict:
    """A record as this gemmgen writes it, from one `problem` accepts (changed in place): a
    timing without TFLOP/s (a library's, before they were recorded) gets them from its ms and
    the MxNxK of its scope."""
    if entry.get("status") == "ok" and "ms" in entry and "tflops" not in entry:
        shape = Scope.of(entry).shape
        entry["tflops"] = (2.0 * shape[0] * shape[1] * shape[2] * shape[4] / (entry["ms"] * 1e-3) / 1e12
                           if shape and entry["ms"] else 0.0)
    return entry


def read(db: str | os.PathLike) -> list[tuple[int, dict]]:
    """Every record of `db` with its line number, in order; [] when there is no file yet.
    Raises DatabaseError (file:line: what is wrong) for anything but a tuning database."""
    db = Path(db)
    records: list[tuple[int, dict]] = []
    cut = 0
    for number, text in enumerate(_text(db).splitlines(), 1):
        text = text.strip()
        if not text:
            continue
        try:
            entry = json.loads(text)
        except ValueError:
            if text.startswith('{"'):
                cut += 1  # the start of a record whose append was interrupted
                continue
            raise DatabaseError(f"{db}:{number}: not JSON: not a gemmgen tuning database (JSON lines, "
                                "one record per line)") from None
        why = problem(entry)
        if why:
            raise DatabaseError(f"{db}:{number}: {why}")
        records.append((number, migrate(entry)))
    if cut and not records:
        raise DatabaseError(f"{db} holds no complete record: not a gemmgen tuning database")
    return records


def latest(records: Iterable[tuple[int, dict]], scope: str | None = None) -> dict[str, dict]:
    """Records of one scope (all scopes when None) by key (by scope|key for all); later lines win."""
    found: dict[str, dict] = {}
    for _, entry in records:
        if scope is None or entry["scope"] == scope:
            found[entry["key"] if scope else entry["scope"] + "|" + entry["key"]] = entry
    return found


def load_records(db: str | os.PathLike, scope: str | None = None) -> dict[str, dict]:
    """The records of one scope of a database by key (see latest). Raises DatabaseError for a
    malformed database."""
    return latest(read(db), scope)


def check(db: str | os.PathLike) -> None:
    """DatabaseError unless `db` is absent, or a tuning database `read` accepts."""
    read(db)


def _settings(label: str) -> dict[str, str]:
    settings = {}
    for word in label.split():
        name, sep, value = word.partition("=")
        settings[name] = value if sep else "yes"
    return settings


def contradiction(recorded: str, today: str) -> str | None:
    """How a record's label contradicts the label of the point its key names, or None."""
    mine, theirs = _settings(recorded), _settings(today)
    for name, value in mine.items():
        if name in theirs:
            if theirs[name] != value:
                return f"{name}={value} where the point has {name}={theirs[name]}"
        elif value == "yes":
            return f"'{name}' where the point is not {name}"
        elif name in _DEFAULTS and value != _DEFAULTS[name]:
            return f"{name}={value} where the point has {name}={_DEFAULTS[name]}"
    for name, value in theirs.items():
        if value == "yes" and name not in mine:
            return f"no '{name}' where the point is {name}"
    return None


def check_labels(db: str | os.PathLike, records: Iterable[tuple[int, dict]], labels: dict[str, str],
                 space: str | None = None) -> None:
    """DatabaseError at the first record (of `space`, if given) whose label contradicts the
    label in `labels` of the point its key names; records of other points are left alone."""
    for number, entry in records:
        if space is not None and Scope.of(entry).owner != space:
            continue
        today = labels.get(entry["key"])
        if today is None or not entry.get("point"):  # no label: it names no point
            continue
        why = contradiction(entry["point"], today)
        if why:
            raise DatabaseError(
                f"{db}:{number}: the record of point {entry['key']} is labelled '{entry['point']}', but "
                f"that key is the point '{today}' ({why}): the line was edited or mixed up, and would "
                "build a kernel other than the one it names; delete the line (or measure it again)")


def check_database(path: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = ()) -> None:
    """Raise OutputError unless `path` may take appended JSON lines (a tuning database): it does
    not exist yet, or is a regular file that `read` accepts (DatabaseError, at the line,
    otherwise), and it is none of the command's inputs. Anything else (a spec, notes, a FIFO)
    would be spoiled by the lines added to it, or never answer."""
    real = real_path(path)
    if any(real == real_path(p) for p in inputs if p):
        raise OutputError(f"refusing to use {path} as the database: it is an input of this command")
    if Path(path).suffix == ".gemm":
        raise OutputError(f"refusing to use {path} as the database: it is a spec; name a .jsonl file")
    if os.path.exists(real) and not os.path.isfile(real):
        raise OutputError(f"refusing to use {path} as the database: it is not a regular file; "
                          "name a .jsonl file")
    read(real)
