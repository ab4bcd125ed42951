"""Bytes and seconds as a person reads them, in every report rhino prints (one formatter
of each; parsing what a person writes, "32 GiB" or "5 us", is `cluster.parse_quantity`)."""

from __future__ import annotations

import math

_BINARY = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: float, places: int = 1, *, up: bool = False) -> str:
    """Binary units, at most `places` decimals, trailing zeros dropped: 100 -> "100 B",
    1024 -> "1 KiB", 1536 -> "1.5 KiB", 3 * 2**30 -> "3 GiB". With `up`, never below `n`
    (rounded up at the last place: a size to suggest as a limit)."""
    value = float(n)
    for unit in _BINARY:
        digits = places if unit != "B" else 0
        shown = math.ceil(value * 10**digits) / 10**digits if up else round(value, digits)
        if abs(shown) < 1024 or unit == _BINARY[-1]:
            text = f"{shown:.{digits}f}"
            if "." in text:
                text = text.rstrip("0").rstrip(".")
            return f"{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def format_seconds(seconds: float) -> str:
    """Microseconds below a millisecond, else milliseconds: 2.826e-05 -> "28.26 us",
    0.091773 -> "91.773 ms"."""
    if abs(seconds) < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    return f"{seconds * 1e3:.3f} ms"
