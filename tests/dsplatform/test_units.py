from __future__ import annotations

import pytest

from dsplatform.units import UnitError, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("800MB", 800_000_000),
        ("800 mb", 800_000_000),
        ("1.5GiB", int(1.5 * 1024**3)),
        ("200k", 200_000),
        ("4096", 4096),
        (123, 123),
        ("0", 0),
    ],
)
def test_sizes_parse_in_decimal_and_binary_units(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "12XB", "-5", "MB", "1.2.3GB", -1])
def test_bad_sizes_say_what_a_size_looks_like(text: str | int) -> None:
    with pytest.raises(UnitError) as excinfo:
        parse_size(text)
    assert "size" in str(excinfo.value)


@pytest.mark.parametrize(
    ("n", "expected"), [(0, "0 B"), (999, "999 B"), (1000, "1 kB"), (812_345_678, "812 MB"), (2.5e12, "2.5 TB")]
)
def test_sizes_print_with_three_significant_digits(n: float, expected: str) -> None:
    assert format_size(n) == expected
