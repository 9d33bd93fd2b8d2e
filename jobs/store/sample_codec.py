"""A trial's raw timing samples as one stored array (`samples.data`, issue 46): the values (integer
nanoseconds, in the order taken) as int64 little-endian, zlib-compressed when that makes them smaller
(codec "i8z"), else as they are (codec "i8"). Timing samples compress to about 0.4-0.55 of their 8 bytes
(100 samples of 0.02-10 ms, zlib level 6); a handful may not, and are kept raw."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

RAW = "i8"
ZLIB = "i8z"
LEVEL = 6


def pack(values: Sequence[int]) -> tuple[str, bytes]:
    """(codec, data) of the samples, whichever of the two codecs is the smaller."""
    raw = np.asarray(values, dtype="<i8").tobytes()
    packed = zlib.compress(raw, LEVEL)
    return (ZLIB, packed) if len(packed) < len(raw) else (RAW, raw)


def unpack(codec: str, data: bytes) -> list[int]:
    """The samples `pack` stored, exactly."""
    if codec == ZLIB:
        data = zlib.decompress(data)
    elif codec != RAW:
        raise ValueError(f"unknown samples codec {codec!r} (known: {RAW}, {ZLIB})")
    return np.frombuffer(data, dtype="<i8").tolist()
