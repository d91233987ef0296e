"""Byte sizes and durations: the one syntax of every setting, flag and printed figure.

Sizes: ``800MB``, ``1.5GiB``, ``50000``. Decimal units (kB, MB, GB, TB) are powers of 1000,
binary units (KiB, MiB, GiB, TiB) powers of 1024; a bare number is bytes.
Durations: ``90`` (seconds), ``250ms``, ``30s``, ``5m``, ``2h``, ``7d``.

Who calls it: the agent's and the extender's settings, ``dsctl`` flags, every log line
and table that prints a size. Errors are :class:`UnitError` (a :class:`ValueError`).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from dsplatform.errors import VocabularyError


class UnitError(VocabularyError):
    """A size or duration that does not parse; ``hint`` says what a good one looks like."""


_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
    "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2,
    "gi": 1024**3, "gib": 1024**3, "ti": 1024**4, "tib": 1024**4,
}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in ``text``; raises :class:`UnitError` saying what a size looks like."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise UnitError(f"size must not be negative, got {text}")
        return text
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise UnitError(
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


_DURATION = r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|)\s*$"  # compiled on first use: dsctl reads no duration
_DURATION_UNITS = {"ms": 0.001, "": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str | float | int) -> float:
    """Seconds in ``text``: ``90``, ``250ms``, ``30s``, ``5m``, ``2h``, ``7d``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = re.match(_DURATION, str(text))
        if match is None:
            raise UnitError(
                f"invalid duration {text!r}", hint="use seconds or a number with ms, s, m, h or d, e.g. 30s, 6h, 7d"
            )
        value = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if value < 0 or not math.isfinite(value):
        raise UnitError(f"duration must be a finite non-negative number, got {text!r}")
    return value


if TYPE_CHECKING:
    from typing import Annotated

    from pydantic import BeforeValidator

    #: A byte size field of a pydantic model or settings object: ``800MB``, ``1.5GiB``, ``4096``.
    Size = Annotated[int, BeforeValidator(parse_size)]
    #: A duration field in seconds: ``250ms``, ``30s``, ``5m``, ``2h``, ``7d``, ``90``.
    Duration = Annotated[float, BeforeValidator(parse_duration)]


def __getattr__(name: str) -> Any:
    """``Size`` and ``Duration`` (pydantic field types), built on first use.

    Importing pydantic costs ~70 ms of a command's start-up (with bytecode caches; 150 ms
    without), and ``dsctl unpack / digest / pack`` parse sizes without any pydantic model:
    only the settings modules, which import pydantic anyway, ask for these.
    """
    if name in ("Size", "Duration"):
        from typing import Annotated

        from pydantic import BeforeValidator

        types = {
            "Size": Annotated[int, BeforeValidator(parse_size)],
            "Duration": Annotated[float, BeforeValidator(parse_duration)],
        }
        globals().update(types)
        return types[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Duration", "Size", "UnitError", "format_size", "parse_duration", "parse_size"]
