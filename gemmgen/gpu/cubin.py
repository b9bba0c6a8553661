"""What a cubin says of its kernels' resources: registers and stack frame, read from its ELF.

ptxas's report (`--ptxas-options=-v`, in NVRTC's program log) is where gemmgen reads registers,
spills and stack. Some NVRTC builds leave the program log empty (seen with NVRTC 13.0 and
cuda-python 13.3.1 on an H100 machine), and a library's tuning needs each candidate's registers
(how many blocks an SM holds). The cubin holds them too: its `.nv.info` section lists, per kernel
symbol, EIATTR_REGCOUNT (the registers a thread uses) and EIATTR_FRAME_SIZE (its stack frame).
Spills are not recorded there (reported as 0), and gemmgen's kernels take their shared memory
dynamically (the Plan's smem_bytes), so static shared memory is reported as 0 too.

Records of `.nv.info`: a format byte, an attribute byte, then two bytes of value, or (format
EIFMT_SVAL) a 16-bit size and that many bytes; REGCOUNT and FRAME_SIZE are SVALs of (symbol index,
value), two little-endian 32-bit words.
"""

from __future__ import annotations

import struct

EIFMT_SVAL = 0x04
EIATTR_FRAME_SIZE = 0x11
EIATTR_REGCOUNT = 0x2F


def _sections(cubin: bytes) -> list[tuple[str, int, int, int]]:
    """(name, file offset, size, link) of each section of a 64-bit little-endian ELF."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF cubin")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    return [(_string(cubin, names_at + h[0]), h[4], h[5], h[6]) for h in headers]


def _string(cubin: bytes, offset: int) -> str:
    return cubin[offset:cubin.index(b"\0", offset)].decode(errors="replace")


def _records(data: bytes):
    at = 0
    while at + 4 <= len(data):
        form, attribute = data[at], data[at + 1]
        if form == EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", data, at + 2)
            yield attribute, data[at + 4:at + 4 + size]
            at += 4 + size
        else:
            yield attribute, data[at + 2:at + 4]
            at += 4


def kernel_resources(cubin: bytes) -> dict[str, tuple[int, int]]:
    """{kernel symbol: (registers, stack frame bytes)} from a cubin's .nv.info; {} where it has none
    (or is no ELF this reader knows)."""
    try:
        sections = _sections(cubin)
        symtab = next((s for s in sections if s[0] == ".symtab"), None)
        info = next((s for s in sections if s[0] == ".nv.info"), None)
        if symtab is None or info is None:
            return {}
        names_at = sections[symtab[3]][1]

        def symbol(index: int) -> str:
            (name,) = struct.unpack_from("<I", cubin, symtab[1] + 24 * index)
            return _string(cubin, names_at + name)

        found: dict[str, list[int]] = {}
        for attribute, value in _records(cubin[info[1]:info[1] + info[2]]):
            if attribute in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE) and len(value) == 8:
                index, number = struct.unpack("<II", value)
                entry = found.setdefault(symbol(index), [0, 0])
                entry[0 if attribute == EIATTR_REGCOUNT else 1] = number
        return {name: (registers, frame) for name, (registers, frame) in found.items() if registers}
    except (ValueError, struct.error, IndexError):
        return {}
