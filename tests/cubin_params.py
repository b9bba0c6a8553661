"""The parameter table the CUDA compiler writes into a cubin, read back for tests.

Each kernel's `.nv.info.<symbol>` ELF section holds EIATTR records; EIATTR_KPARAM_INFO (0x17)
gives each parameter's ordinal, its byte offset in the kernel's parameter space and its size. The
offsets are relative to the parameter bank, which may start a parameter after some padding (the
first of a 64-byte aligned parameter lands on a 64-byte boundary of the bank), so tests compare
offsets relative to the first parameter's.
"""

from __future__ import annotations

import struct

EIATTR_KPARAM_INFO = 0x17
EIFMT_SVAL = 0x04  # a record with a 16-bit size and a body; the other formats are 4 bytes in all


def sections(elf: bytes) -> dict[str, bytes]:
    """The sections of a 64-bit little-endian ELF file, by name."""
    assert elf[:4] == b"\x7fELF" and elf[4] == 2, "a 64-bit ELF file"
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    entry_size, count, names_index = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * entry_size) for i in range(count)]
    names = headers[names_index][4]

    def name_at(offset: int) -> str:
        return elf[names + offset: elf.index(b"\0", names + offset)].decode()

    return {name_at(h[0]): elf[h[4]: h[4] + h[5]] for h in headers}


def kernel_parameters(elf: bytes, symbol: str) -> list[tuple[int, int]]:
    """(offset, size) of each parameter of a kernel, in order, offsets from the first one's."""
    data = sections(elf)[f".nv.info.{symbol}"]
    found, at = {}, 0
    while at < len(data):
        form, attribute = data[at], data[at + 1]
        if form == EIFMT_SVAL:
            size = struct.unpack_from("<H", data, at + 2)[0]
            body, at = data[at + 4: at + 4 + size], at + 4 + size
        else:
            body, at = data[at + 2: at + 4], at + 4
        if attribute == EIATTR_KPARAM_INFO:
            _, ordinal, offset, flags = struct.unpack_from("<IHHI", body)
            found[ordinal] = (offset, (flags >> 18) & 0x3FFF)
    first = found[0][0]
    return [(found[i][0] - first, found[i][1]) for i in range(len(found))]
