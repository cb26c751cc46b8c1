"""fleetctl's Slurm-style time limits and sizes (pure functions, no server)."""

from __future__ import annotations

import pytest

from fleetctl.units import UsageError, format_duration, parse_size_mb, parse_time


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90 * 60),  # minutes
        ("10:30", 10 * 60 + 30),  # minutes:seconds
        ("1:00:00", 3600),  # hours:minutes:seconds
        ("2-3", 2 * 86400 + 3 * 3600),  # days-hours
        ("1-2:30", 86400 + 2 * 3600 + 30 * 60),  # days-hours:minutes
        ("1-0:0:5", 86405),  # days-hours:minutes:seconds
        ("2h", 7200),
        ("30m", 1800),
        ("1h30m", 5400),
        ("1d12h", 36 * 3600),
        ("45s", 45),
    ],
)
def test_slurm_time_formats(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "soon", "1:2:3:4", "h2", "2x", "1-", "-1", "0", "0:00", "1h-"]
)
def test_unreadable_times_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError):
        parse_time(text)


@pytest.mark.parametrize(
    ("text", "mb"), [("4096", 4096), ("16G", 16384), ("512M", 512), ("1T", 1048576),
                     ("1.5g", 1536), ("20GiB", 20480)],
)  # fmt: skip
def test_sizes(text: str, mb: int) -> None:
    assert parse_size_mb(text) == mb


@pytest.mark.parametrize("text", ["lots", "-1G", "0", "12Q"])
def test_unreadable_sizes(text: str) -> None:
    with pytest.raises(UsageError):
        parse_size_mb(text)


def test_durations_print_as_squeue_does() -> None:
    assert [format_duration(s) for s in (59, 61, 3600, 90061, None)] == [
        "0:59", "1:01", "01:00:00", "1-01:01:01", "-"
    ]  # fmt: skip
