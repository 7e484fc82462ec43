"""Minimal reader of an uncompressed tar's member list: (name, data offset, size) of its regular files.

The loader reads shards sample by sample; ``tarfile`` spends ~20 us of Python per member header
(every field parsed, TarInfo objects built), as much as reading the small members themselves. This
parses only what the loader needs from each 512-byte header: name (ustar prefix, PAX ``path``
and GNU long names included), size (octal, base-256 and PAX ``size``) and type, and checks the
header checksum (a damaged shard raises a ValueError that says what to do).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

_BLOCK = 512


def _number(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256 (sizes >= 8 GiB)
        return int.from_bytes(field[1:], "big")
    field = field.split(b"\0", 1)[0].strip()
    return int(field, 8) if field else 0


def _checksum_ok(header: bytes) -> bool:
    stored = _number(header[148:156])
    unsigned = sum(header) - sum(header[148:156]) + 8 * 32
    if stored == unsigned:
        return True
    signed = unsigned - 256 * sum(1 for b in header if b > 127)  # old tars summed signed chars
    return stored == signed


def _pax(data: bytes) -> dict[str, str]:
    out, pos = {}, 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos += length
    return out


def tar_members(f: BinaryIO, path: str = "") -> Iterator[tuple[str, int, int]]:
    """``(name, byte offset of the data, size)`` of each regular file of the tar open as ``f``, in order.

    ``f`` must be seekable; it is left positioned anywhere (seek before reading a member).
    """
    pos, longname, pax = 0, None, {}
    while True:
        f.seek(pos)
        header = f.read(_BLOCK)
        if len(header) < _BLOCK or header.count(0) == _BLOCK:
            return
        if not _checksum_ok(header):
            raise ValueError(f"{path or 'tar'}: bad tar header at byte {pos}; run `moquad verify` and re-run "
                             "`moquad preprocess` for this shard")
        kind = header[156:157]
        size = _number(header[124:136])
        data = pos + _BLOCK
        if kind == b"x":
            pax = _pax(f.read(size))
        elif kind == b"L":
            longname = f.read(size).split(b"\0", 1)[0].decode("utf-8", "replace")
        elif kind in (b"0", b"\0", b"7"):
            if "size" in pax:
                size = int(pax["size"])
            name = pax.get("path") or longname
            if name is None:
                name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
                if header[257:262] == b"ustar" and header[345]:
                    prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace")
                    name = f"{prefix}/{name}"
            yield name, data, size
            longname, pax = None, {}
        else:  # directories, links, global PAX headers...: skipped
            longname, pax = None, {}
        pos = data + (size + _BLOCK - 1) // _BLOCK * _BLOCK
