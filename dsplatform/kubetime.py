"""Kubernetes times: the one reader and the two writers of the API server's time strings.

The API server writes ``metav1.Time`` (``creationTimestamp``, a pod's ``startTime``,
conditions) as ``2006-01-02T15:04:05Z`` and ``metav1.MicroTime`` (a Lease's ``renewTime``
and ``acquireTime``, events) as ``2006-01-02T15:04:05.000000Z``, always in UTC. It reads
either with Go's ``time.RFC3339`` parser, which is the rule :func:`parse` follows:
``YYYY-MM-DDTHH:MM:SS``, an optional fraction of 1-9 digits, then ``Z`` or an offset
``+HH:MM`` / ``-HH:MM`` - upper-case ``T`` and ``Z``, nothing else. Python's
``datetime.fromisoformat`` accepts much more (a date alone, a space for ``T``, the basic
``20261122T180000Z`` form, and times without a zone, which it reads as *local* time); a
string the API server would refuse is refused here too, so no component reads a time the
others would not.

Who calls it: the extender (pods' ``creationTimestamp`` and ``startTime``, the
``dsagent.io/deadline`` annotation), dsagent's cluster code (Leases, the Dataset
controller's status times, next-job preparation) and the agent's own records.
Times are epoch seconds (``float``), as every caller computes with them.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from dsplatform.errors import VocabularyError

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:(Z)|([+-])(\d{2}):(\d{2}))",
)
HINT = "an RFC 3339 time such as 2026-11-22T18:00:00Z or 2026-11-22T20:00:00.5+02:00"


class KubeTimeError(VocabularyError):
    """A string that is not a Kubernetes (RFC 3339) time."""


def parse(text: str) -> float:
    """Epoch seconds of an RFC 3339 time as the API server reads it; :class:`KubeTimeError`
    saying why otherwise. A fraction finer than microseconds is cut, as ``MicroTime`` does."""
    match = _RFC3339.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        shown = repr(text[:60]) if isinstance(text, str) else type(text).__name__
        raise KubeTimeError(f"{shown} is not an RFC 3339 time", hint=HINT)
    year, month, day, hour, minute, second, fraction, utc, sign, off_h, off_m = match.groups()
    try:
        if utc:
            zone = dt.timezone.utc
        else:
            offset = dt.timedelta(hours=int(off_h), minutes=int(off_m))
            zone = dt.timezone(-offset if sign == "-" else offset)
        when = dt.datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int((fraction or "0")[:6].ljust(6, "0")),
            tzinfo=zone,
        )
    except ValueError as exc:  # month 13, 25:00, an offset of a day or more, ...
        raise KubeTimeError(f"{text!r} is not an RFC 3339 time: {exc}", hint=HINT) from None
    return when.timestamp()


def parse_or_none(value: Any) -> float | None:
    """Epoch seconds of ``value`` when it is a Kubernetes time; None when absent or not one
    (for fields of objects read from the API, where a bad value must not stop the reader)."""
    try:
        return parse(value)
    except KubeTimeError:
        return None


def _utc(when: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(when, dt.timezone.utc)


def format_time(when: float) -> str:
    """A ``metav1.Time``: whole seconds, UTC (``2026-11-22T18:00:00Z``); a fraction is cut, as Go's does."""
    return _utc(when).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(when: float) -> str:
    """A ``metav1.MicroTime``: microseconds, UTC (``2026-11-22T18:00:00.000000Z``), as Leases carry."""
    return _utc(when).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


__all__ = ["HINT", "KubeTimeError", "format_micro_time", "format_time", "parse", "parse_or_none"]
