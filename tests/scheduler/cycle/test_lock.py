"""Two cycles at once: one runs, the other does nothing. On PostgreSQL (DATABASE_URL) this
exercises the advisory lock; on SQLite the Redis lock with its owner token."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from django.db import connection

from fleet.models import Job, JobEvent, JobState
from fleet.services import messaging
from scheduler.cycle import lock, runner
from scheduler.cycle.runner import run_cycle
from tests.messages import node_message_args
from tests.scheduler.cycle.conftest import make_job, make_node

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_lock_is_exclusive_and_released(db: Any) -> None:
    results: list[bool] = []
    with lock.cycle_lock() as first:
        assert first is True
        # Another thread has its own database connection, as another worker would.
        worker = threading.Thread(target=lambda: _try_lock(results))
        worker.start()
        worker.join(timeout=30)
    assert results == [False]
    with lock.cycle_lock() as again:
        assert again is True


def _try_lock(results: list[bool]) -> None:
    try:
        with lock.cycle_lock() as acquired:
            results.append(acquired)
    finally:
        connection.close()


def test_two_cycles_at_once_apply_each_decision_once(
    owner: Any, team: Any, monkeypatch: Any
) -> None:
    make_node("sim-a", 4)
    make_node("sim-b", 4)
    jobs = [make_job(owner, team) for _ in range(6)] + [make_job(owner, team, gpus=2)]
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(
        messaging,
        "_send",
        lambda task, queue, kwargs, countdown=None: (
            sent.append(node_message_args(task, queue, kwargs))
            if task == messaging.START_JOB_TASK
            else None
        ),
    )
    # Hold whichever cycle gets in until the other has tried: their lifetimes overlap.
    inside, release = threading.Event(), threading.Event()
    real_build = runner.build_snapshot

    def slow_build(**kwargs: Any) -> Any:
        inside.set()
        release.wait(timeout=10)
        return real_build(**kwargs)

    monkeypatch.setattr(runner, "build_snapshot", slow_build)
    results: list[Any] = []
    done = threading.Semaphore(0)

    def cycle() -> None:
        try:
            results.append(run_cycle())
        finally:
            connection.close()
            done.release()

    threads = [threading.Thread(target=cycle) for _ in range(2)]
    for t in threads:
        t.start()
    assert inside.wait(timeout=10)
    # The cycle that did not get the lock returns at once; a broken lock would let both in.
    first_back = done.acquire(timeout=5)
    release.set()
    for t in threads:
        t.join(timeout=30)
    assert first_back
    assert sorted(r is None for r in results) == [False, True]

    dispatched = Counter(
        JobEvent.objects.filter(to_state=JobState.ASSIGNED).values_list("job_id", flat=True)
    )
    assert set(dispatched.values()) == {1} and len(dispatched) == len(jobs)
    assert Counter(s["job_id"] for s in sent) == dispatched
    taken = Counter(
        (job.node_id, i)
        for job in Job.objects.filter(state=JobState.ASSIGNED)
        for i in job.gpu_indices
    )
    assert set(taken.values()) == {1} and len(taken) == 8
