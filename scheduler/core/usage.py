"""Decayed GPU usage, the memory behind fair share.

Usage halves every `half_life` seconds, so what a team ran a week ago counts little
against what it runs today. Fleet's default half-life is one day (settings key
"fairshare_half_life", in seconds); the snapshot builder applies it between cycles and
the simulator does the same, so policies only read `TeamState.decayed_usage`.
"""

from __future__ import annotations

DEFAULT_HALF_LIFE = 86400.0


def decay_factor(elapsed: float, half_life: float) -> float:
    if half_life <= 0:
        return 0.0
    return 0.5 ** (max(elapsed, 0.0) / half_life)


def decay_usage(
    previous: float, used_gpu_seconds: float, elapsed: float, half_life: float = DEFAULT_HALF_LIFE
) -> float:
    """Usage after `elapsed` seconds in which `used_gpu_seconds` were added.

    The old value decays over the whole interval; the new usage, spread over the interval,
    decays on average by half the interval (exact for usage at a constant rate would be an
    integral; the midpoint keeps it simple and unbiased for short intervals).
    """
    return previous * decay_factor(elapsed, half_life) + used_gpu_seconds * decay_factor(
        elapsed / 2, half_life
    )
