"""Slurm-style time limits and memory sizes."""

from __future__ import annotations

import re


class UsageError(ValueError):
    """A command-line value fleetctl cannot use; exit status 2."""


_SUFFIX = re.compile(r"(\d+)([dhms])")
_SUFFIX_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_time(text: str) -> int:
    """A time limit in seconds from Slurm's formats: "minutes", "minutes:seconds",
    "hours:minutes:seconds", "days-hours", "days-hours:minutes",
    "days-hours:minutes:seconds", or suffixed parts such as "2h", "30m", "1h30m", "1d"."""
    value = text.strip().lower()
    hint = (
        f"Cannot read time limit {text!r}; give minutes (90), MM:SS, HH:MM:SS, D-HH, "
        "D-HH:MM, D-HH:MM:SS, or 2h / 30m / 1d12h."
    )
    if not value:
        raise UsageError(hint)
    if value[-1] in _SUFFIX_SECONDS and value[0].isdigit():
        parts = _SUFFIX.findall(value)
        if "".join(n + u for n, u in parts) != value:
            raise UsageError(hint)
        seconds = sum(int(n) * _SUFFIX_SECONDS[u] for n, u in parts)
    else:
        days = 0
        if "-" in value:
            day_text, _, value = value.partition("-")
            if not day_text.isdigit():
                raise UsageError(hint)
            days = int(day_text)
        fields = value.split(":")
        if not all(f.isdigit() for f in fields) or len(fields) > 3:
            raise UsageError(hint)
        numbers = [int(f) for f in fields]
        if days or "-" in text:
            # After a day count, fields are hours[:minutes[:seconds]].
            numbers += [0] * (3 - len(numbers))
            h, m, s = numbers
        elif len(numbers) == 1:
            h, m, s = 0, numbers[0], 0
        elif len(numbers) == 2:
            h, (m, s) = 0, numbers
        else:
            h, m, s = numbers
        seconds = days * 86400 + h * 3600 + m * 60 + s
    if seconds <= 0:
        raise UsageError(f"The time limit must be more than zero; got {text!r}.")
    return seconds


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?$")
_SIZE_MB = {"k": 1 / 1024, "": 1, "m": 1, "g": 1024, "t": 1024 * 1024}


def parse_size_mb(text: str, what: str = "memory") -> int:
    """A size in MiB: a plain number is MiB (as in Slurm), or with a K, M, G or T suffix."""
    match = _SIZE.match(text.strip().lower())
    if not match:
        raise UsageError(f"Cannot read {what} {text!r}; give MiB (4096) or a size like 16G, 512M.")
    mb = float(match.group(1)) * _SIZE_MB[match.group(2)]
    if mb < 1:
        raise UsageError(f"The {what} must be at least 1 MiB; got {text!r}.")
    return int(round(mb))


def format_duration(seconds: float | None) -> str:
    """[D-]HH:MM:SS, as squeue prints times."""
    if seconds is None:
        return "-"
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    text = f"{h:02d}:{m:02d}:{s:02d}" if h or days else f"{m:d}:{s:02d}"
    return f"{days}-{text}" if days else text
