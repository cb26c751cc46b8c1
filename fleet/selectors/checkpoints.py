"""How attempts started: whether each resumed from a checkpoint (see
fleet.services.job_reports, which records it in the job's events)."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Q

from fleet.models import JobEvent
from fleet.models.jobs import ActorKind
from fleet.services.job_reports import FRESH, RESUMED


def attempt_resumed(*, job_id: int, attempt: int) -> bool | None:
    """Whether the attempt resumed from a checkpoint (any member did), started fresh, or
    None when its node did not say (not started yet, or an agent without checkpoints)."""
    return attempts_resumed(attempts=[(job_id, attempt)]).get(job_id)


def attempts_resumed(*, attempts: Iterable[tuple[int, int]]) -> dict[int, bool | None]:
    """`attempt_resumed` for many (job id, attempt) pairs in one query, by job id: a job
    list shows each job's current attempt without a query per job."""
    wanted = dict(attempts)
    said: dict[int, bool | None] = dict.fromkeys(wanted)
    if not wanted:
        return said
    # Only nodes' words count: a person's cancel reason could read the same.
    notes = JobEvent.objects.filter(
        job_id__in=wanted, applied=True, actor_kind=ActorKind.NODE
    ).filter(Q(reason__contains=RESUMED) | Q(reason__contains=FRESH))
    for job_id, attempt, reason in notes.values_list("job_id", "attempt", "reason"):
        if wanted.get(job_id) != attempt or said[job_id]:
            continue
        if f"attempt {attempt} {RESUMED}" in reason:
            said[job_id] = True
        elif f"attempt {attempt} {FRESH}" in reason:
            said[job_id] = False
    return said
