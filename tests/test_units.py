from __future__ import annotations

import pytest

from daemon.units import format_bytes, parse_memory, parse_percent

GIB = 1024**3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("20GiB", 20 * GIB),
        ("512MiB", 512 * 1024**2),
        ("1.5 GiB", 3 * GIB // 2),
        ("8GB", 8 * 10**9),
        ("800MB", 800 * 10**6),
        ("64KiB", 64 * 1024),
        ("2TiB", 2 * 1024**4),
        ("3TB", 3 * 10**12),
        ("10kb", 10_000),
        ("20gib", 20 * GIB),
        ("20 GIB", 20 * GIB),
        ("  4 MiB ", 4 * 1024**2),
        (".5KiB", 512),
        ("0GiB", 0),
        ("123 B", 123),
    ],
)
def test_memory_sizes_with_a_unit_are_bytes(text: str, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (20, "20 needs a unit, e.g. '20GiB' or '512MiB'"),
        (1.5, "1.5 needs a unit, e.g. '20GiB' or '512MiB'"),
        ("20", "'20' needs a unit, e.g. '20GiB' or '512MiB'"),
        ("80%", "'80%' is a percentage, not a memory size (write e.g. '20GiB')"),
        ("-5GiB", "'-5GiB' is negative; a memory size is 0 or more"),
        (True, "True is not a memory size; write e.g. '20GiB' or '512MiB'"),
        (None, "None is not a memory size; write e.g. '20GiB' or '512MiB'"),
        (["20GiB"], "['20GiB'] is not a memory size; write e.g. '20GiB' or '512MiB'"),
        ("plenty", "'plenty' is not a memory size; write e.g. '20GiB' or '512MiB'"),
        ("", "'' is not a memory size; write e.g. '20GiB' or '512MiB'"),
    ],
)
def test_memory_rejections_name_the_value(value: object, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_memory(value)
    assert str(raised.value) == message


@pytest.mark.parametrize("text", ["20 GHz", "20G", "20Gi", "20 gigabytes"])
def test_an_unknown_unit_lists_the_known_ones(text: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_memory(text)
    message = str(raised.value)
    assert message.startswith(f"{text!r} has an unknown unit")
    for unit in ("KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB"):
        assert unit in message


def test_field_prefixes_the_message_for_callers_outside_pydantic() -> None:
    with pytest.raises(ValueError, match=r"^min_host_free_memory: '8' needs a unit"):
        parse_memory("8", field="min_host_free_memory")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("80%", 80.0), ("80 %", 80.0), (" 12.5% ", 12.5), ("0%", 0.0), ("100%", 100.0), (80, 80.0)],
)
def test_percentages(value: object, expected: float) -> None:
    assert parse_percent(value) == expected


@pytest.mark.parametrize(("value", "expected"), [(0, 0.0), (1, 1.0), (1.0, 1.0), (99.5, 99.5), (100, 100.0)])
def test_numbers_are_percent(value: float, expected: float) -> None:
    result = parse_percent(value)
    assert result == expected
    assert isinstance(result, float)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("20GiB", "'20GiB' is a memory size, not a percentage (write e.g. '80%')"),
        (0.8, "0.8 looks like a fraction; write '80%' for 80 percent"),
        (0.29, "0.29 looks like a fraction; write '29%' for 29 percent"),
        (0.125, "0.125 looks like a fraction; write '12.5%' for 12.5 percent"),
        (120, "120 is outside 0..100 (percent)"),
        (-1, "-1 is outside 0..100 (percent)"),
        (float("nan"), "nan is outside 0..100 (percent)"),
        ("120%", "'120%' is outside 0%..100%"),
        ("-5%", "'-5%' is outside 0%..100%"),
        ("80", "'80' needs a '%' sign, e.g. '80%'"),
        ("busy", "'busy' is not a percentage; write e.g. '80%'"),
        (True, "True is not a percentage; write e.g. '80%'"),
        (None, "None is not a percentage; write e.g. '80%'"),
    ],
)
def test_percent_rejections_name_the_value(value: object, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_percent(value)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (20 * GIB, "20.0 GiB"),
        (512 * 1024**2, "512.0 MiB"),
        (int(3.2 * GIB), "3.2 GiB"),
        (2 * 1024**4, "2.0 TiB"),
        (1536, "1.5 KiB"),
        (1024, "1.0 KiB"),
        (123, "123 B"),
        (0, "0 B"),
    ],
)
def test_format_bytes_uses_the_largest_unit_at_least_one(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_formatted_sizes_parse_back() -> None:
    for n in (123, 20 * GIB, 512 * 1024**2):
        assert parse_memory(format_bytes(n)) == n
