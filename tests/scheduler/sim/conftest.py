from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.sim.jobs import JobSpec

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "philly_sample.csv"


def job(id: int, submit: float, duration: float, gpus: int = 1, **kw) -> JobSpec:
    kw.setdefault("team", "a")
    kw.setdefault("user", kw["team"])
    kw.setdefault("time_limit", duration * 2)
    return JobSpec(id=id, submit=submit, duration=duration, gpus=gpus, **kw)


@pytest.fixture
def sample_path() -> Path:
    return SAMPLE
