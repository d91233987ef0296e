from __future__ import annotations

import datetime as dt

import pytest

from dsplatform.kubetime import KubeTimeError, format_micro_time, format_time, parse, parse_or_none

NOON = dt.datetime(2026, 11, 22, 12, tzinfo=dt.timezone.utc).timestamp()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-22T12:00:00Z", NOON),  # metav1.Time
        ("2026-11-22T12:00:00.000000Z", NOON),  # metav1.MicroTime
        ("2026-11-22T12:00:00.250000Z", NOON + 0.25),
        ("2026-11-22T12:00:00.5Z", NOON + 0.5),  # any number of fraction digits up to nine
        ("2026-11-22T12:00:00.123456789Z", NOON + 0.123456),  # finer than microseconds: cut
        ("2026-11-22T14:00:00+02:00", NOON),  # offsets
        ("2026-11-22T06:30:00-05:30", NOON),
        ("2026-11-22T12:00:00+00:00", NOON),
        ("2026-11-23T11:00:00.5+23:00", NOON + 0.5),
    ],
)
def test_rfc3339_times_parse_to_epoch_seconds(text: str, expected: float) -> None:
    assert parse(text) == pytest.approx(expected, abs=1e-6)
    assert parse_or_none(text) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "yesterday",
        "2026-11-22T12:00:00",  # no zone: fromisoformat read it as local time
        "2026-11-22",  # a date alone
        "2026-11-22 12:00:00Z",  # space for T
        "2026-11-22t12:00:00z",  # lower case
        "20261122T120000Z",  # ISO 8601 basic form
        "2026-11-22T12:00Z",  # no seconds
        "2026-11-22T12:00:00.Z",  # an empty fraction
        "2026-11-22T12:00:00.1234567890Z",  # ten fraction digits
        "2026-11-22T12:00:00+0200",  # offset without colon
        "2026-13-01T00:00:00Z",  # month 13
        "2026-02-30T00:00:00Z",
        "2026-11-22T25:00:00Z",
        "2026-11-22T23:59:60Z",  # leap second: Go refuses it too
        "2026-11-22T12:00:00+24:00",  # an offset of a day
        "2026-11-22T12:00:00Z\n",  # a trailing newline
        " 2026-11-22T12:00:00Z",
        "2026-11-22T12:00:00Z" + "0" * 100,
    ],
)
def test_what_the_api_server_would_refuse_is_refused_with_the_form_as_hint(text: str) -> None:
    with pytest.raises(KubeTimeError) as excinfo:
        parse(text)
    assert "not an RFC 3339 time" in str(excinfo.value)
    assert excinfo.value.hint is not None and "2026-11-22T18:00:00Z" in excinfo.value.hint
    assert isinstance(excinfo.value, ValueError)
    assert parse_or_none(text) is None


@pytest.mark.parametrize("value", [None, 0, 1.5, b"2026-11-22T12:00:00Z", {}])
def test_a_field_that_is_not_a_string_is_no_time(value: object) -> None:
    assert parse_or_none(value) is None
    with pytest.raises(KubeTimeError):
        parse(value)  # type: ignore[arg-type]


def test_times_format_as_the_api_server_writes_them_in_utc() -> None:
    assert format_time(NOON) == "2026-11-22T12:00:00Z"
    assert format_time(NOON + 0.75) == "2026-11-22T12:00:00Z"  # whole seconds, cut
    assert format_micro_time(NOON) == "2026-11-22T12:00:00.000000Z"
    assert format_micro_time(NOON + 0.25) == "2026-11-22T12:00:00.250000Z"


@pytest.mark.parametrize("when", [0.0, NOON, NOON + 0.000001, NOON + 0.123456, 1_790_000_000.999999])
def test_a_micro_time_reads_back_to_the_same_string(when: float) -> None:
    text = format_micro_time(when)
    assert format_micro_time(parse(text)) == text
    assert parse(text) == pytest.approx(when, abs=1e-6)
    assert parse(format_time(when)) == float(int(when))
