"""The base of dsplatform's errors: a :class:`ValueError` that also speaks the edges' language.

Both edges of the platform (the CLI's ``main`` and each HTTP API's exception handler) turn
any error carrying ``exit_code`` / ``http_status`` / ``code`` into one line or one JSON body,
so a bad size in a flag or a bad name in a request needs no translation layer of its own.
"""

from __future__ import annotations

from typing import ClassVar


class VocabularyError(ValueError):
    """Input that breaks one of the shared rules (a name, a size, a duration)."""

    http_status: ClassVar[int] = 400
    exit_code: ClassVar[int] = 2
    code: ClassVar[str] = "invalid_input"

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(f"{message} ({hint})" if hint else message)
        self.message = message
        self.hint = hint


__all__ = ["VocabularyError"]
