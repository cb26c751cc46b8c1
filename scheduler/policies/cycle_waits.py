"""The waits part of the policies' shared cycle (scheduler.policies.base.Cycle): a Wait
per pending job not placed, with the sentence that says why (settings "explain"), made
once per request and reused for the jobs alike, a run of jobs at a time."""

from __future__ import annotations

from collections import deque
from functools import lru_cache
from itertools import repeat
from operator import attrgetter
from typing import Any

from scheduler.core.admission import FLEET_FIELDS, FleetProfile, fleet_profile, limit_error
from scheduler.core.explain import why_waiting
from scheduler.core.model import Member, PendingJob, Snapshot, Wait
from scheduler.core.placement import FreeCapacity
from scheduler.core.quota import QuotaLedger
from scheduler.policies.cycle_parts import HeldReservation
from scheduler.policies.walk import request_key

_fleet_request = attrgetter(*FLEET_FIELDS)
_new = object.__new__
_set_job_id = vars(Wait)["job_id"].__set__
_set_reason = vars(Wait)["reason"].__set__
_set_eta = vars(Wait)["eta"].__set__


def _waits_of(ids: list[int], reasons: list[str]) -> list[Wait]:
    """[Wait(i, r) for i, r in zip(ids, reasons)], built by setting the slots directly:
    the frozen dataclass's __init__ goes through object.__setattr__ per field, the larger
    part of the cost once per waiting job."""
    waits = list(map(_new, repeat(Wait, len(ids))))
    deque(map(_set_job_id, waits, ids), maxlen=0)
    deque(map(_set_reason, waits, reasons), maxlen=0)
    deque(map(_set_eta, waits, repeat(None, len(ids))), maxlen=0)
    return waits


@lru_cache(maxsize=1 << 16)
def _quiet_wait(job_id: int) -> Wait:
    """A Wait without a sentence (settings "explain" false); frozen, so shared."""
    return Wait(job_id, "")


class CycleWaits:
    """Cycle's waits (Cycle sets these attributes)."""

    snapshot: Snapshot
    cap: FreeCapacity
    quota: QuotaLedger
    order: list[int]
    _walked: list[PendingJob]
    _room_runs: list[tuple[int, int, bool]]
    _rewaited: bool
    _waits: dict[int, tuple[PendingJob, str, Any]]
    _reservation: HeldReservation | None
    _profile: FleetProfile | None
    _fleet_errors: dict[tuple[Any, ...], str | None]

    def _quiet_waits(self, placed: set[int]) -> list[Wait]:
        """A Wait without a sentence per job walked and not placed, in order (a reserved
        job's with its start)."""
        waits = []
        for job_id in self.order:
            if job_id in placed:
                continue
            entry = self._waits.get(job_id)
            if entry is not None and entry[1] == "reserved":
                waits.append(Wait(job_id, "", eta=entry[2].start))
            else:
                waits.append(_quiet_wait(job_id))
        return waits

    def _explained_waits(self, placed: set[int]) -> list[Wait]:
        """A Wait with its sentence per job walked and not placed, in order. A job waiting
        for room gets the sentence of the first before it alike in request_key (which
        `_room` made for the first job of its shape and team); the runs the walk recorded
        at once (`_room_runs`) are looked up a run at a time."""
        reasons: dict[tuple[Any, ...], str] = {}  # _room's and _wait_for's
        known: dict[Any, str] = {}  # request_key: the sentence of a job waiting for room
        waits: list[Wait] = []
        walked, order = self._walked, self.order
        runs = [] if self._rewaited else self._room_runs
        at = 0
        for start, end, by_quota in (*runs, (len(order), len(order), False)):
            # (a run where the quota holds some job is explained job by job)
            for job in walked[at : end if by_quota else start]:
                if job.id not in placed:
                    waits.append(self._explained(job, reasons, known))
            at = end
            if by_quota or start == end:
                continue
            jobs = walked[start:end]
            texts: list[Any] = list(map(known.get, map(request_key, jobs)))
            if None in texts:
                for i, text in enumerate(texts):
                    if text is None:
                        texts[i] = self._room_sentence(jobs[i], reasons, known)
            waits.extend(_waits_of(order[start:end], texts))
        return waits

    def _explained(self, job: PendingJob, reasons: dict, known: dict) -> Wait:
        entry = self._waits.get(job.id)
        if entry is None:
            kind, detail = "resources", None
        else:
            job, kind, detail = entry
        held = self._reservation
        if kind == "resources" and (held is None or job.id != held.job_id):
            return Wait(job.id, self._room_sentence(job, reasons, known))
        return self._wait_for(job, kind, detail, reasons)

    def _room_sentence(self, job: PendingJob, reasons: dict, known: dict) -> str:
        """`_for_room` of a job other than the reserved one, shared by the jobs alike in
        request_key (finer than `_room`'s shape and team)."""
        key = request_key(job)
        text = known.get(key)
        if text is None:
            text = known[key] = self._for_room(job, reasons)
        return text

    def _room(self, job: PendingJob, cache: dict[tuple[Any, ...], str]) -> str:
        key = (FreeCapacity.shape(job), job.team)
        text = cache.get(key)
        if text is None:
            if self._profile is None:
                self._profile = fleet_profile(self.snapshot.nodes)
            fleet = _fleet_request(job)
            if fleet in self._fleet_errors:
                text = self._fleet_errors[fleet]
            else:
                text = self._fleet_errors[fleet] = self._profile.fleet_error(job)
            if text is None:
                text = limit_error(job, self.snapshot.teams.get(job.team))
            if text is not None:
                text = f"can never start: {text}"
            else:
                text = why_waiting(job, self.cap, self.snapshot, self.quota)
            cache[key] = text
        return text

    def _wait_for(self, job: PendingJob, kind: str, detail: Any, cache: dict) -> Wait:
        if kind in ("quota", "text"):
            return Wait(job.id, detail)
        if kind == "blocked":
            return Wait(job.id, f"queued behind job {detail}, which does not fit yet")
        if kind == "reserved":
            where = "; ".join(
                f"GPUs {', '.join(str(i) for i in m.gpu_indices)} on {m.node}"
                for m in (Member(detail.node, detail.gpu_indices), *detail.members)
            )
            # No time here: the ETA (one forecast, with its band) says when; a reservation's
            # start from time limits would be a second, different answer.
            return Wait(job.id, f"first in line: {where} are reserved for it", eta=detail.start)
        if kind == "preempting":
            count = len(detail.jobs)
            noun = "job" if count == 1 else "jobs"
            nodes = ", ".join(m.node for m in detail.allocations)
            return Wait(job.id, f"waiting for {count} preempted {noun} to release GPUs on {nodes}")
        if kind == "releasing":
            return Wait(
                job.id,
                f"waiting for jobs preempted for it to release GPUs on {', '.join(detail)}",
            )
        return Wait(job.id, self._for_room(job, cache))

    def _for_room(self, job: PendingJob, cache: dict) -> str:
        """`_room`'s sentence, and for a job other than the reserved one, whose GPUs the
        reservation holds."""
        text = self._room(job, cache)
        held = self._reservation
        if held is not None and job.id != held.job_id and not text.startswith("can never"):
            suffix = cache.get(("held",))
            if suffix is None:
                suffix = cache[("held",)] = (
                    f"; GPUs on {', '.join(held.nodes)} are reserved for job {held.job_id}"
                )
            text += suffix
        return text
