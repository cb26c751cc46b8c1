"""Job arrays and bulk submits: many jobs from one request, each a normal Job row.

An array is one job request run once per index ("0-99", "0-15:4", "1,3,5-7", or a count N
meaning 0..N-1), like Slurm's `sbatch --array`; each task is a Job with `array` and
`array_index`, and its process sees FLEET_ARRAY_JOB_ID, FLEET_ARRAY_INDEX and
FLEET_ARRAY_TASK_COUNT. A bulk submit is a list of unrelated job requests. Both are
validated whole before anything is written (the fleet's node shapes and the user's teams
are read once per request, not once per job) and inserted with bulk INSERTs (BATCH rows
each) in one transaction, so a request is taken whole or refused whole (docs/arrays.md).
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count

from fleet.errors import ApplicationError, NotAllowed, NotFound
from fleet.models import Job
from fleet.models.jobs import ACTIVE_STATES, QUEUED_STATES, JobArray
from fleet.services import messaging
from fleet.services.access import admin_team_ids
from fleet.services.job_batches import job_cancel_queued_many
from fleet.services.job_insert import jobs_insert_with_events
from fleet.services.job_states import Actor, StaleAttempt, TransitionRefused, job_transition
from fleet.services.jobs import (
    JobRequest,
    job_validate,
    stop_previous_attempt,
    submitted_event,
    user_memberships,
)
from scheduler.cycle.admission import fleet_nodes

# The largest index a task may have (the column is a 32-bit integer).
MAX_INDEX = 2**31 - 1
BATCH = 2000
CANCELLABLE = (*QUEUED_STATES, *ACTIVE_STATES)
HINT = (
    "write a count such as 16 (indices 0-15), a range such as 0-99, a range with a step "
    "such as 0-99:4, or a list such as 1,3,5-7"
)
_PART = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def _array_error(message: str) -> ApplicationError:
    return ApplicationError(message, {"fields": {"array": [message]}})


def max_array_size() -> int:
    return int(getattr(settings, "FLEET_MAX_ARRAY_SIZE", 10_000))


def max_bulk_jobs() -> int:
    return int(getattr(settings, "FLEET_MAX_BULK_JOBS", 10_000))


def _too_many(count: int) -> ApplicationError:
    cap = max_array_size()
    return _array_error(
        f"The array has {count} tasks; at most {cap} are allowed in one array. Split it into "
        f"several arrays (0-{cap - 1}, then {cap}-{2 * cap - 1}, ...)."
    )


def array_indices(spec: Any) -> list[int]:
    """The task indices of an array spec, ascending: a whole number N (0..N-1) or a string
    of comma-separated indices and ranges ("A-B", "A-B:STEP"). ApplicationError (400 on the
    field `array`) says what is wrong and what to write instead."""
    if isinstance(spec, bool) or not isinstance(spec, int | str):
        raise _array_error(f"array must be a number or a string; {HINT}.")
    if isinstance(spec, int):
        if spec < 1:
            raise _array_error(f"array {spec} asks for no tasks; {HINT}.")
        if spec > max_array_size():
            raise _too_many(spec)
        return list(range(spec))
    text = spec.strip()
    if not text:
        raise _array_error(f"array is empty; {HINT}.")
    if "%" in text:
        raise _array_error(
            f"array {text!r} has a throttle (%): fleet does not limit how many tasks of an "
            f"array run at once yet. Remove '%{text.split('%', 1)[1]}'; a team's per-user GPU "
            "cap limits how many run together."
        )
    ranges: list[range] = []
    total = 0
    for raw in text.split(","):
        part = raw.strip()
        match = _PART.match(part)
        if match is None:
            if part.startswith("-") or re.match(r"^\d+--", part):
                raise _array_error(
                    f"array {text!r}: {part!r} is negative; indices start at 0 ({HINT})."
                )
            raise _array_error(f"array {text!r}: {part!r} is not an index or a range; {HINT}.")
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        step = int(match[3]) if match[3] is not None else 1
        if last < first:
            raise _array_error(
                f"array {text!r}: the range {part!r} ends before it starts; write "
                f"{last}-{first} instead."
            )
        if step < 1:
            raise _array_error(
                f"array {text!r}: the step of {part!r} must be 1 or more, such as {first}-{last}:2."
            )
        if last > MAX_INDEX:
            raise _array_error(f"array {text!r}: indices go up to {MAX_INDEX}.")
        indices = range(first, last + 1, step)
        total += len(indices)
        if total > max_array_size():
            raise _too_many(total)
        ranges.append(indices)
    seen: set[int] = set()
    for indices in ranges:
        for index in indices:
            if index in seen:
                raise _array_error(
                    f"array {text!r} names index {index} more than once; name each index once "
                    "(for example 1,3,5-7, not 1,3,3-7)."
                )
            seen.add(index)
    return sorted(seen)


def job_array_submit(*, user: Any, request: JobRequest, array: Any) -> tuple[JobArray, list[Job]]:
    """One job per index of `array` (see `array_indices`), all from one request validated
    once; the array and its tasks (in index order) once committed."""
    indices = array_indices(array)
    team, values = job_validate(user=user, request=request)
    with transaction.atomic():
        job_array = JobArray.objects.create(
            owner=user,
            team=team,
            name=values["name"],
            spec=str(array).strip(),
            task_count=len(indices),
        )
        jobs = [
            Job(owner=user, team=team, array=job_array, array_index=index, **values)
            for index in indices
        ]
        jobs_insert_with_events(jobs=jobs, event=submitted_event(user), batch=BATCH)
        messaging.request_schedule()
    return job_array, jobs


def _item_error(index: int, exc: ApplicationError) -> ApplicationError:
    """The refusal of one item of a bulk submit as the request's: on its field `jobs`, the
    message led by `jobs[i].field`, the item's own fields in `item_fields`."""
    fields = exc.extra.get("fields") or {}
    where = f"jobs[{index}]" + (f".{next(iter(fields))}" if fields else "")
    message = f"{where}: {exc.message}"
    extra = {**exc.extra, "index": index, "fields": {"jobs": [message]}, "item_fields": fields}
    return type(exc)(message, extra)


def jobs_submit_many(*, user: Any, requests: list[JobRequest]) -> list[Job]:
    """Every job of a bulk submit, or none: the first bad request refuses the whole list
    with its index (`extra.index`, and `jobs[i].field` in the message)."""
    if not requests:
        raise ApplicationError(
            "jobs is empty; give a list of job requests.", {"fields": {"jobs": ["empty"]}}
        )
    cap = max_bulk_jobs()
    if len(requests) > cap:
        message = (
            f"The request has {len(requests)} jobs; at most {cap} are allowed in one bulk "
            "submit. Send them in several requests."
        )
        raise ApplicationError(message, {"fields": {"jobs": [message]}})
    memberships = user_memberships(user)
    nodes = fleet_nodes()
    jobs: list[Job] = []
    for index, request in enumerate(requests):
        try:
            team, values = job_validate(
                user=user, request=request, memberships=memberships, nodes=nodes
            )
        except ApplicationError as exc:
            raise _item_error(index, exc) from exc
        jobs.append(Job(owner=user, team=team, **values))
    with transaction.atomic():
        jobs_insert_with_events(jobs=jobs, event=submitted_event(user), batch=BATCH)
        messaging.request_schedule()
    return jobs


def job_array_get(*, array_id: int, fetched_by: Any) -> JobArray:
    """An array, for anyone who may see the queue (like its jobs)."""
    found = JobArray.objects.select_related("owner", "team").filter(id=array_id).first()
    if found is None:
        raise NotFound(f"Job array {array_id} does not exist.")
    return found


def can_manage_array(user: Any, job_array: JobArray) -> bool:
    """The rule of `can_manage_job` for every task at once: the array's owner, admins of
    its team and staff."""
    if not user.is_authenticated:
        return False
    if user.is_staff or job_array.owner_id == user.id:
        return True
    return job_array.team_id in admin_team_ids(user)


def job_array_cancel(*, user: Any, job_array: JobArray, reason: str = "") -> int:
    """Cancel every task of the array that has not ended; how many were cancelled. Each
    goes through the state machine like a single cancel, and running tasks are stopped."""
    if not can_manage_array(user, job_array):
        raise NotAllowed(
            f"Only the array's owner, admins of team {job_array.team.slug} and staff may "
            f"cancel job array {job_array.pk}."
        )
    reason = reason or f"cancelled by {user.get_username()} (whole array {job_array.pk})"
    actor = Actor.user(user)
    tasks = Job.objects.filter(array=job_array, state__in=CANCELLABLE)
    with transaction.atomic():
        # Queued tasks in one statement; the rest (on a node, or held by a scheduling cycle
        # at that moment) one by one, so each started attempt is stopped.
        queued = list(tasks.filter(state__in=QUEUED_STATES).values_list("id", flat=True))
        cancelled = len(job_cancel_queued_many(job_ids=queued, actor=actor, reason=reason))
        for job_id in tasks.order_by("array_index").values_list("id", flat=True):
            try:
                job = job_transition(job_id=job_id, action="cancel", actor=actor, reason=reason)
            except (TransitionRefused, StaleAttempt):
                continue  # it ended or changed meanwhile: nothing to cancel
            stop_previous_attempt(job, reason=job.state_reason)
            cancelled += 1
        messaging.request_schedule()
    return cancelled


def job_array_states(*, job_array: JobArray) -> dict[str, int]:
    """How many of the array's tasks are in each state (states with none left out)."""
    rows = Job.objects.filter(array=job_array).values("state").annotate(n=Count("id"))
    return {row["state"]: row["n"] for row in rows.order_by("state")}
