"""Cycles while a preemption's victims stop: the GPUs stay held for their grace period, and
the job they were preempted for waits for them instead of preempting again."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.models import GpuRelease, Job, JobState
from fleet.selectors.jobs import job_state_reason
from fleet.services.job_reports import job_report_apply
from scheduler.cycle.runner import run_cycle
from tests.scheduler.cycle.conftest import make_job, make_node, make_running

pytestmark = pytest.mark.django_db


def _borrowed_fleet(outsider: Any, other_team: Any) -> tuple[Any, Any, dict[str, Job]]:
    """Nodes sim-a and sim-b of 2 GPUs, each filled by a preemptible job of another team:
    (a, b, node name -> its job)."""
    a, b = make_node("sim-a", 2), make_node("sim-b", 2)
    borrowed = {
        node.name: make_running(outsider, other_team, node, [0, 1], preemptible=True)
        for node in (a, b)
    }
    return a, b, borrowed


def test_the_job_a_preemption_was_for_waits_for_its_victims_to_stop(
    owner: Any, team: Any, outsider: Any, other_team: Any, sent: list[Any]
) -> None:
    team.guaranteed_gpus = 2
    team.save()
    a, b, borrowed = _borrowed_fleet(outsider, other_team)
    claimant = make_job(owner, team, gpus=2)
    first = run_cycle()
    assert first is not None and (first.preempted, first.placed) == (1, 0)
    victim = Job.objects.get(pk__in=[j.pk for j in borrowed.values()], state=JobState.PENDING)
    assert set(GpuRelease.objects.values_list("job_id", "for_job_id")) == {(victim.pk, claimant.pk)}
    # The victim is in its grace period: more cycles preempt nobody else for the claimant.
    for _ in range(2):
        record = run_cycle()
        assert record is not None and (record.preempted, record.placed) == (0, 0)
    other = next(j for j in borrowed.values() if j.pk != victim.pk)
    assert Job.objects.get(pk=other.pk).state == JobState.RUNNING
    stopping_on = next(name for name, j in borrowed.items() if j.pk == victim.pk)
    assert job_state_reason(job=Job.objects.get(pk=claimant.pk), fetched_by=owner) == (
        f"waiting for jobs preempted for it to release GPUs on {stopping_on}"
    )
    # Its agent reports the end: the hold goes, and the claimant gets those GPUs.
    node = a if stopping_on == a.name else b
    job_report_apply(node=node, job_id=victim.pk, attempt=1, state="preempted", exit_code=-15)
    assert not GpuRelease.objects.exists()
    record = run_cycle()
    assert record is not None and (record.preempted, record.placed) == (0, 1)
    claimant.refresh_from_db()
    assert claimant.state == JobState.ASSIGNED and claimant.node_id == node.pk


def test_preempted_jobs_still_stopping_count_against_the_cap(
    owner: Any, team: Any, outsider: Any, other_team: Any, sent: list[Any]
) -> None:
    from scheduler.cycle.config import settings_update

    settings_update(user=None, policy="priority", params={"max_preemptions_per_cycle": 1})
    team.guaranteed_gpus = 4
    team.save()
    a, b, _ = _borrowed_fleet(outsider, other_team)
    first, second = make_job(owner, team, gpus=2), make_job(owner, team, gpus=2)
    record = run_cycle()
    assert record is not None and record.preempted == 1
    (victim,) = Job.objects.filter(team=other_team, state=JobState.PENDING)
    assert GpuRelease.objects.get().for_job_id == first.pk
    # One victim still stops: the cap of one is reached, so the second job does not preempt.
    record = run_cycle()
    assert record is not None and record.preempted == 0
    stopped_on = a if victim.previous_node_id == a.pk else b
    job_report_apply(node=stopped_on, job_id=victim.pk, attempt=1, state="preempted", exit_code=-15)
    record = run_cycle()
    assert record is not None and (record.placed, record.preempted) == (1, 1)
    assert Job.objects.get(pk=first.pk).state == JobState.ASSIGNED
    assert GpuRelease.objects.get().for_job_id == second.pk


def test_the_snapshot_says_when_held_gpus_come_back_and_the_forecast_counts_on_it(
    owner: Any, team: Any, outsider: Any, other_team: Any, sent: list[Any]
) -> None:
    from scheduler.core.eta import estimate
    from scheduler.cycle.snapshot import build_snapshot
    from scheduler.policies import get_policy

    team.guaranteed_gpus = 2
    team.save()
    a, b, _ = _borrowed_fleet(outsider, other_team)
    claimant = make_job(owner, team, gpus=2)
    first = run_cycle()
    assert first is not None and first.preempted == 1
    hold = GpuRelease.objects.get()
    snap = build_snapshot(save_usage=False)
    (held,) = snap.core.holds
    on = a if hold.node_id == a.pk else b
    assert (held.node, held.gpu_indices, held.gpus) == (on.name, (0, 1), 2)
    assert held.end == hold.expires_at.timestamp()
    # The claimant waits for those GPUs: its forecast start is the hold's expiry at the
    # latest, not the end of the job still running on the other node.
    forecast = estimate(snap.core, get_policy(snap.policy))
    start = forecast[claimant.pk][1]
    assert start is not None and snap.core.now < start <= held.end
