"""Human-readable byte sizes: ``800MB``, ``1.5GiB``, ``50000``.

Decimal units (kB, MB, GB, TB) are powers of 1000, binary units (KiB, MiB, GiB, TiB) powers
of 1024; a bare number is bytes. Used by settings, flags and every printed size.
"""

from __future__ import annotations

import re

from dsagent.errors import InvalidInput

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
    "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2,
    "gi": 1024**3, "gib": 1024**3, "ti": 1024**4, "tib": 1024**4,
}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in ``text``; raises :class:`InvalidInput` saying what a size looks like."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise InvalidInput(f"size must not be negative, got {text}")
        return text
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise InvalidInput(
            f"invalid size {text!r}",
            hint="use a number of bytes or a number with a unit, e.g. 800MB, 1.5GiB, 200k",
        )
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(n: int | float) -> str:
    """``n`` bytes with a decimal unit and three significant digits: ``812 MB``."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            break
        value /= 1000
    if unit == "B":
        return f"{int(value)} B"
    return f"{value:.3g} {unit}"
