"""The on-disk compile cache: one file per entry, all of it under one checksum, the least recently
used entries evicted past a size cap, and a warning (once per process) when it cannot work.

Where: $GEMMGEN_CACHE, else $XDG_CACHE_HOME/gemmgen, else ~/.cache/gemmgen.
How large: $GEMMGEN_CACHE_SIZE bytes (a number with an optional K, M, G or T suffix, 1024-based:
"1G", "512M"), 1 GiB by default; 0 turns the cache off.

An entry is the file `<key>.entry`:

    gemmgen compile cache, format 3       first line
    <sha256 of everything below>          second line
    {"key": ..., "meta": {...}, "blobs": [["cubin", 123456], ["ptx", 7890]]}
    <the blobs' bytes, one after the other>

It is written whole to a temporary file beside it and renamed into place (outputs.write_atomic),
so a reader opens either the old entry or the new one, never half of one; an entry whose checksum,
key or layout is wrong is a miss, compiled again and replaced. Reading an entry touches its
modification time, which is how eviction knows the least recently used.

Eviction runs after each write when the cache is over its cap, and removes the least recently used
entries until it is under 90% of it. It only ever removes what this module writes: finished entries
(never the one just written), format-2 entry folders (`<key>/` holding kernel.cubin, kernel.ptx
and meta.json) and temporary files left for over an hour by a process that died while writing.
An entry another process is writing is still a temporary file, so eviction never takes it; one it
is reading is already open, and POSIX keeps its bytes until it is closed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
import time
from pathlib import Path

from ..outputs import write_atomic

FORMAT_LINE = b"gemmgen compile cache, format 3\n"
DEFAULT_SIZE = 1 << 30          # bytes: 1 GiB
LOW_WATER = 0.9                 # eviction stops below this fraction of the cap
MAX_ENTRY_BYTES = 256 << 20     # larger is not an entry gemmgen wrote (cubins are a few MB): never read
STALE_TEMPORARY_SECONDS = 3600  # a write takes milliseconds: a temporary file this old is a dead writer's

_KEY = re.compile(r"[0-9a-f]{32}")
_ENTRY = re.compile(r"([0-9a-f]{32})\.entry")
_TEMPORARY = re.compile(r"\.[0-9a-f]{32}\.entry\..+\.tmp\.entry")  # outputs.replacing's names
_LEGACY_FILES = re.compile(r"(kernel\.cubin|kernel\.ptx|meta\.json)|\.(kernel\.cubin|kernel\.ptx|meta\.json)\..+\.tmp.*")
_SIZE = re.compile(r"\s*(\d+)\s*(?:([KMGT])(?:i?B)?|B)?\s*", re.IGNORECASE)
_UNITS = {None: 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

_warned = False


def warn_once(message: str) -> None:
    """One line on stderr, the first time the cache fails in this process; later failures are quiet
    (each build would repeat it). The cache failing never stops a compile."""
    global _warned
    if not _warned:
        _warned = True
        print(f"gemmgen: warning: {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    root = os.environ.get("GEMMGEN_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gemmgen"


def parse_size(text: str) -> int | None:
    """Bytes from "1073741824", "1G", "512MiB", "100k" (1024-based units); None if not a size."""
    match = _SIZE.fullmatch(text)
    if not match:
        return None
    unit = match.group(2).upper() if match.group(2) else None
    return int(match.group(1)) * _UNITS[unit]


def size_cap() -> int:
    """The cap in bytes: $GEMMGEN_CACHE_SIZE, or DEFAULT_SIZE (also, with a warning, when unreadable)."""
    text = os.environ.get("GEMMGEN_CACHE_SIZE")
    if text is None or not text.strip():
        return DEFAULT_SIZE
    size = parse_size(text)
    if size is None:
        warn_once(f"GEMMGEN_CACHE_SIZE={text!r} is not a size: the compile cache keeps its default cap "
                  f"of 1 GiB; give bytes or a number with K, M, G or T (e.g. 2G), or 0 to turn it off")
        return DEFAULT_SIZE
    return size


def entry_path(key: str) -> Path:
    return cache_dir() / f"{key}.entry"


def encode(key: str, meta: dict, blobs: dict[str, bytes]) -> bytes:
    header = json.dumps({"key": key, "meta": meta, "blobs": [[name, len(data)] for name, data in blobs.items()]},
                        sort_keys=True).encode()
    body = header + b"\n" + b"".join(blobs.values())
    return FORMAT_LINE + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def decode(key: str, data: bytes) -> tuple[dict, dict[str, bytes]] | None:
    """(meta, blobs) of an entry's bytes, or None unless they are whole, unchanged and of `key`."""
    if not data.startswith(FORMAT_LINE):
        return None
    digest, _, body = data[len(FORMAT_LINE):].partition(b"\n")
    if hashlib.sha256(body).hexdigest().encode() != digest:
        return None  # cut short, overwritten or edited: the checksum covers every byte served
    header, _, rest = body.partition(b"\n")
    try:
        parsed = json.loads(header)
        if parsed["key"] != key or not isinstance(parsed["meta"], dict):
            return None  # an entry copied under another key's name
        blobs, offset = {}, 0
        for name, size in parsed["blobs"]:
            if not isinstance(name, str) or not isinstance(size, int) or size < 0:
                return None
            blobs[name] = rest[offset:offset + size]
            offset += size
        if offset != len(rest):
            return None
        return parsed["meta"], blobs
    except (ValueError, KeyError, TypeError):
        return None


def _not_a_file(path: Path, info: os.stat_result) -> str:
    what = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
    return (f"the compile cache entry {path} is {what}, so its kernel is compiled again on every build: "
            f"remove it (rm -r '{path}')")


def load(key: str) -> tuple[dict, dict[str, bytes]] | None:
    """The entry of `key` as (meta, blobs), or None (a miss): none there, or not whole and unchanged.
    A hit marks the entry as just used. An entry that cannot be read at all warns once."""
    if size_cap() == 0:
        return None
    path = entry_path(key)
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):  # a folder, or a pipe that would block a read
            warn_once(_not_a_file(path, info))
            return None
        if info.st_size > MAX_ENTRY_BYTES:
            return None  # not an entry gemmgen wrote: compiled again, and replaced
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        warn_once(f"cannot read the compile cache entry {path} ({exc.strerror or exc}), so its kernel is "
                  f"compiled again on every build: remove it, or set GEMMGEN_CACHE to another folder")
        return None
    decoded = decode(key, data)
    if decoded is not None:
        try:
            os.utime(path)  # least recently used is what eviction removes first
        except OSError:
            pass  # a read-only cache still serves
    return decoded


def store(key: str, meta: dict, blobs: dict[str, bytes]) -> None:
    """Write the entry of `key` whole (replacing any there), then evict past the cap. A cache that
    cannot be written warns once and costs only compiling again."""
    cap = size_cap()
    if cap == 0:
        return
    path = entry_path(key)
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):  # never written into, nor renamed over
            warn_once(_not_a_file(path, info))
            return
    except OSError:
        pass  # no entry yet (or unreadable: the write below says why)
    try:
        write_atomic(path, encode(key, meta, blobs))
    except OSError as exc:
        warn_once(f"cannot write the compile cache in {path.parent} ({exc.strerror or exc}), so every "
                  f"kernel is compiled again: make that folder writable, or set GEMMGEN_CACHE to a "
                  f"writable folder (GEMMGEN_CACHE_SIZE=0 turns the cache off)")
        return
    evict(cap, keep=path)


def _legacy_entry(folder: str) -> tuple[float, int, list[str]] | None:
    """(newest modification time, bytes, files) of a format-2 entry folder, or None when it holds
    anything gemmgen did not write there (then it is not ours to remove)."""
    newest, size, files = 0.0, 0, []
    try:
        with os.scandir(folder) as items:
            for item in items:
                info = item.stat(follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode) or not _LEGACY_FILES.fullmatch(item.name):
                    return None
                newest, size = max(newest, info.st_mtime), size + info.st_size
                files.append(item.path)
    except OSError:
        return None
    return newest, size, files


def evict(cap: int, keep: Path | None = None) -> None:
    """Remove the least recently used entries while the cache holds more than `cap` bytes, down to
    LOW_WATER x cap; `keep` (the entry just written) stays. Safe beside other processes: what they
    remove first is skipped, and what they are writing is not an entry yet."""
    root = cache_dir()
    now = time.time()
    entries: list[tuple[float, int, str, list[str] | None]] = []  # (last use, bytes, path, legacy files)
    try:
        items = list(os.scandir(root))
    except OSError:
        return
    for item in items:
        try:
            info = item.stat(follow_symlinks=False)
        except OSError:
            continue  # removed meanwhile
        if stat.S_ISREG(info.st_mode) and _ENTRY.fullmatch(item.name):
            entries.append((info.st_mtime, info.st_size, item.path, None))
        elif stat.S_ISREG(info.st_mode) and _TEMPORARY.fullmatch(item.name):
            if now - info.st_mtime > STALE_TEMPORARY_SECONDS:
                _remove(item.path)
        elif stat.S_ISDIR(info.st_mode) and _KEY.fullmatch(item.name):
            legacy = _legacy_entry(item.path)
            if legacy is not None:
                entries.append((legacy[0], legacy[1], item.path, legacy[2]))
    total = sum(size for _, size, _, _ in entries)
    if total <= cap:
        return
    kept = str(keep) if keep is not None else None
    for _, size, path, legacy in sorted(entries):
        if total <= cap * LOW_WATER:
            break
        if path == kept:
            continue
        if legacy is None:
            _remove(path)
        else:
            for file in legacy:
                _remove(file)
            try:
                os.rmdir(path)
            except OSError:
                pass  # something new inside: it stays
        total -= size


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # another process evicted it first
    except OSError as exc:
        warn_once(f"cannot remove {path} from the compile cache ({exc.strerror or exc}): the cache may "
                  f"grow past GEMMGEN_CACHE_SIZE; make {Path(path).parent} writable")

