"""How attempts started: whether each resumed from a checkpoint (see
fleet.services.job_reports, which records it in the job's events)."""

from __future__ import annotations

from fleet.models import JobEvent
from fleet.models.jobs import ActorKind
from fleet.services.job_reports import FRESH, RESUMED


def attempt_resumed(*, job_id: int, attempt: int) -> bool | None:
    """Whether the attempt resumed from a checkpoint (any member did), started fresh, or
    None when its node did not say (not started yet, or an agent without checkpoints)."""
    # Only nodes' words count: a person's cancel reason could read the same.
    notes = JobEvent.objects.filter(
        job_id=job_id, attempt=attempt, applied=True, actor_kind=ActorKind.NODE
    ).filter(reason__contains=f"attempt {attempt} ")
    said = None
    for reason in notes.values_list("reason", flat=True):
        if f"attempt {attempt} {RESUMED}" in reason:
            return True
        if f"attempt {attempt} {FRESH}" in reason:
            said = False
    return said
