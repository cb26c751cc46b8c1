"""The job state machine: the only code that writes `Job.state`.

Every transition is a conditional UPDATE on (id, state, attempt) inside a transaction
that also writes one JobEvent. A decision made on a stale read therefore changes
nothing (docs/design.md, rules 2 and 3): the update matches no row, and the caller learns why.

Attempts count dispatches: `dispatch` (pending -> assigned) increments `attempt`, so every
report an agent sends carries the attempt it runs and older attempts are fenced off.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from fleet.errors import Conflict, NotFound
from fleet.models import Job, JobEvent, JobState
from fleet.models.jobs import ActorKind
from fleet.services.fences import fence_on_commit
from fleet.services.notifications import notify_on_commit

log = logging.getLogger(__name__)

S = JobState


@dataclass(frozen=True)
class Transition:
    name: str
    sources: frozenset[str]
    target: str
    # What the transition is for, for error messages: "hold applies only to pending jobs".
    applies_to: str


def _t(name: str, sources: tuple[str, ...], target: str, applies_to: str) -> Transition:
    return Transition(name, frozenset(sources), target, applies_to)


TRANSITIONS: dict[str, Transition] = {
    t.name: t
    for t in (
        _t("dispatch", (S.PENDING,), S.ASSIGNED, "pending jobs"),
        _t("start", (S.ASSIGNED,), S.RUNNING, "assigned jobs"),
        _t("succeed", (S.RUNNING,), S.SUCCEEDED, "running jobs"),
        _t("fail", (S.ASSIGNED, S.RUNNING), S.FAILED, "assigned or running jobs"),
        _t("time_out", (S.RUNNING,), S.TIMEOUT, "running jobs"),
        _t(
            "cancel",
            (S.PENDING, S.HELD, S.ASSIGNED, S.RUNNING),
            S.CANCELLED,
            "pending, held, assigned or running jobs",
        ),
        _t("hold", (S.PENDING,), S.HELD, "pending jobs"),
        _t("release", (S.HELD,), S.PENDING, "held jobs"),
        _t(
            "requeue",
            (S.ASSIGNED, S.RUNNING, S.FAILED, S.CANCELLED, S.TIMEOUT, S.LOST),
            S.PENDING,
            "assigned, running or finished jobs",
        ),
        _t("preempt", (S.ASSIGNED, S.RUNNING), S.PENDING, "assigned or running jobs"),
        _t("lose", (S.ASSIGNED, S.RUNNING), S.LOST, "assigned or running jobs"),
        _t("recover", (S.LOST,), S.PENDING, "lost jobs"),
        _t("fail_lost", (S.LOST,), S.FAILED, "lost jobs"),
        _t("undispatch", (S.ASSIGNED,), S.PENDING, "assigned jobs"),
        # The node reports that the attempt succeeded after the control side gave it up
        # (lost, then requeued) but before dispatching it again: the work is done.
        _t("succeed_late", (S.LOST, S.PENDING, S.HELD), S.SUCCEEDED, "lost or requeued jobs"),
    )
}
# States in which an attempt may have a process on its node.
ON_NODE = frozenset({S.ASSIGNED, S.RUNNING})

# Transitions that put a job back in the queue after it held GPUs: they count as requeues.
REQUEUING = frozenset({"requeue", "preempt", "recover"})
ENDING = frozenset({S.SUCCEEDED, S.FAILED, S.TIMEOUT, S.CANCELLED, S.LOST})
# Fields cleared when a job goes back to the queue.
_PLACEMENT_RESET: dict[str, Any] = {
    "node": None,
    "gpu_indices": [],
    "pid": None,
    "assigned_at": None,
    "started_at": None,
    "finished_at": None,
    "exit_code": None,
}


class TransitionRefused(Conflict):
    """The job's state does not allow the transition."""


class StaleAttempt(Conflict):
    """A report or decision for an attempt that is no longer the job's current one."""


@dataclass(frozen=True)
class Actor:
    kind: str
    name: str = ""

    @classmethod
    def user(cls, user: Any) -> Actor:
        return cls(ActorKind.USER, user.get_username())

    @classmethod
    def node(cls, name: str) -> Actor:
        return cls(ActorKind.NODE, name)


SCHEDULER = Actor(ActorKind.SCHEDULER, "scheduler")
SYSTEM = Actor(ActorKind.SYSTEM, "system")


def transition_changes(
    action: str, *, attempt: int, requeues: int, reason: str, now: Any
) -> dict[str, Any]:
    """The columns a transition writes besides its caller's own fields (one definition for
    the single and the batched path)."""
    transition = TRANSITIONS[action]
    update: dict[str, Any] = {
        "state": transition.target,
        "state_reason": reason[:1000],
        "updated_at": now,
    }
    if action == "dispatch":
        update.update(attempt=attempt + 1, assigned_at=now)
    elif action == "start":
        update["started_at"] = now
    if transition.target == S.PENDING and action != "release":
        update.update(_PLACEMENT_RESET)
        if action in REQUEUING:
            update["requeues"] = requeues + 1
    elif transition.target in ENDING:
        update["finished_at"] = now
    return update


def job_transition(
    *,
    job_id: int,
    action: str,
    actor: Actor,
    reason: str = "",
    attempt: int | None = None,
    fields: dict[str, Any] | None = None,
) -> Job:
    """Apply one transition and return the updated job.

    `attempt` fences the change: when given, the job's current attempt must equal it (agent
    reports and scheduler decisions pass it); when None, the attempt read now is used, so a
    concurrent change between read and write still makes the update miss.

    Raises TransitionRefused when the state does not allow `action`, StaleAttempt when
    `attempt` is not the current one, NotFound when there is no such job.
    """
    transition = TRANSITIONS[action]
    extra = dict(fields or {})
    now = timezone.now()
    with transaction.atomic():
        current = (
            Job.objects.filter(id=job_id)
            .values("state", "attempt", "requeues", "node_id", "gpu_indices", "assigned_at")
            .first()
        )
        if current is None:
            raise NotFound(f"Job {job_id} does not exist.")
        if attempt is not None and attempt != current["attempt"]:
            raise StaleAttempt(
                f"Job {job_id} is on attempt {current['attempt']}; "
                f"this {action} was for attempt {attempt}.",
                {"state": current["state"], "attempt": current["attempt"]},
            )
        if current["state"] not in transition.sources:
            raise TransitionRefused(
                f"Job {job_id} is {current['state']}; {action} applies only to "
                f"{transition.applies_to}.",
                {"state": current["state"], "action": action},
            )
        expected_attempt = current["attempt"]
        update = transition_changes(
            action, attempt=expected_attempt, requeues=current["requeues"], reason=reason, now=now
        )
        update.update(extra)
        if action == "dispatch" and "node" in extra:
            update["attempt_node"] = extra["node"]
        updated = Job.objects.filter(
            id=job_id, state=current["state"], attempt=expected_attempt
        ).update(**update)
        if updated != 1:
            # Someone changed the row between our read and our write: do not force.
            raise StaleAttempt(
                f"Job {job_id} changed while {action} was being applied; nothing was changed."
            )
        JobEvent.objects.create(
            job_id=job_id,
            from_state=current["state"],
            to_state=transition.target,
            attempt=update.get("attempt", expected_attempt),
            reason=reason[:1000],
            actor_kind=actor.kind,
            actor=actor.name,
        )
        notify_on_commit(job_id=job_id, attempt=expected_attempt, action=action, reason=reason)
        if current["state"] in ON_NODE and transition.target not in ON_NODE:
            # The attempt is over: a start for it still queued at its node must not run.
            fence_on_commit(
                job_id=job_id, attempt=expected_attempt, assigned_at=current["assigned_at"]
            )
    job = Job.objects.select_related("node", "team", "owner").get(id=job_id)
    # What the job was before this transition, for callers that must undo side effects
    # (stop the process of the attempt that was running, on the node that ran it).
    job.previous_state = current["state"]
    job.previous_attempt = expected_attempt
    job.previous_node_id = current["node_id"]
    job.previous_gpu_indices = tuple(current["gpu_indices"] or ())
    return job


def job_record_ignored(*, job_id: int, action: str, actor: Actor, attempt: int, why: str) -> None:
    """Record a report that was not applied (stale attempt, duplicate, or out of order)."""
    job = Job.objects.filter(id=job_id).values("state").first()
    if job is None:
        log.info("ignored %s for unknown job %s from %s", action, job_id, actor.name)
        return
    JobEvent.objects.create(
        job_id=job_id,
        from_state=job["state"],
        to_state=job["state"],
        attempt=attempt,
        reason=f"ignored {action}: {why}"[:1000],
        actor_kind=actor.kind,
        actor=actor.name,
        applied=False,
    )
