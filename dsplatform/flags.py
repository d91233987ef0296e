"""The one boolean syntax of every setting, without pydantic.

Who calls it: :data:`dsplatform.settings.Flag` (every settings class's booleans) and the
command lines' edges that read a switch before any settings class is imported
(``DSAGENT_NATIVE`` in :mod:`dsagent.cli.edge`: ``dsctl digest`` does not import pydantic).
"""

from __future__ import annotations

from typing import Any

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def parse_flag(value: Any) -> bool:
    """The one boolean syntax of every setting: 1/0, true/false, yes/no, on/off (empty: false)."""
    if isinstance(value, bool):
        return value
    lowered = str(value).strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{value!r} is not a boolean (expected 1/0, true/false, yes/no or on/off)")


__all__ = ["parse_flag"]
