"""Jobs expected to be submitted while the queue waits, for the ETA forecast.

A forecast of only the current queue is wrong in a predictable direction under any policy
that lets later jobs go first: gittins and gittins-tiers run a short job submitted in an
hour before a long one waiting now, and priority does so for a higher priority. The
forecast (`scheduler.core.eta.estimate`) therefore plays forward an expected stream of
submissions as well: the recent ones, replayed. The jobs submitted in the last `window`
seconds are expected again in the next `window`, at the same offsets, and again in the
one after (a rate and a mix of sizes, time limits and predicted runtimes learned from this
fleet's own recent submissions, without fitting a model to them). The stream depends only
on what was submitted, so the forecast it gives moves smoothly from one cycle to the next.

Where an expected job goes in the queue is the active policy's own decision: `rank`
schedules the queue once with the expected jobs added (each as it would be at its
submission) and reads where the policy put each of them among the real ones. A job of the
stream then competes at each forecast event in that place, and takes GPUs only once it has
been submitted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from scheduler.core.model import PendingJob, Snapshot

DEFAULT_WINDOW = 6 * 3600.0
# Expected submissions one forecast plays at most (the stream repeats the window).
DEFAULT_MAX_ARRIVALS = 2000

# A job's place in the forecast's queue: (position of the real job it follows, copy of the
# window it belongs to (-1: a real job), index in the window).
Rank = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Arrivals:
    """The submissions of the last `window` seconds before `now` (`recent`, each as it was
    first queued), to be replayed after `now`."""

    now: float
    recent: tuple[PendingJob, ...]
    window: float = DEFAULT_WINDOW
    max_arrivals: int = DEFAULT_MAX_ARRIVALS

    @classmethod
    def from_submissions(
        cls, now: float, jobs: Iterable[PendingJob], window: float = DEFAULT_WINDOW, **params: Any
    ) -> Arrivals:
        """Keep the jobs submitted in (now - window, now], oldest first."""
        recent = sorted(
            (j for j in jobs if now - window < j.submitted_at <= now),
            key=lambda j: (j.submitted_at, j.id),
        )
        return cls(now, tuple(recent), window, **params)

    def templates(self) -> list[PendingJob]:
        """The window's jobs as the stream's first copy submits them: fresh (no service
        attained, never preempted), each `window` seconds after its original, with an id no
        real job has (negative)."""
        return [
            replace(
                job,
                id=-(i + 1),
                submitted_at=job.submitted_at + self.window,
                attained_service=0.0,
                preemptions=0,
                queued_at=None,
            )
            for i, job in enumerate(self.recent)
        ]

    def stream(
        self, start: float, templates: Sequence[PendingJob]
    ) -> Iterator[tuple[float, int, int, PendingJob]]:
        """(submit time, copy, index in the window, job) for every expected submission after
        `start`, in time order: the window (`templates()`) replayed again and again,
        `max_arrivals` at most."""
        if not templates or self.window <= 0:
            return
        n = len(templates)
        made = 0
        copy = 0
        while made < self.max_arrivals:
            shift = copy * self.window
            for i, job in enumerate(templates):
                at = job.submitted_at + shift
                if at <= start:
                    continue
                if copy:
                    job = replace(job, id=-(copy * n + i + 1), submitted_at=at)
                yield at, copy, i, job
                made += 1
                if made >= self.max_arrivals:
                    return
            copy += 1


def rank(
    snapshot: Snapshot, policy: Any, order: Sequence[int], templates: Sequence[PendingJob]
) -> tuple[dict[int, Rank], list[int]]:
    """Where each expected job goes among the real ones under the policy.

    `templates`: the window's jobs (`Arrivals.templates`). Returns the real jobs' ranks (plan order, keyed by id) and, per window index, the
    position of the real job each expected job follows (-1: ahead of every real job). The
    policy schedules the queue once with the window's jobs added; only its order is read.
    Copies of the window that come later keep their template's place (behind its earlier
    copies), which is exact for orders that do not depend on waiting time (gittins) and
    close for the others."""
    real = {job_id: i for i, job_id in enumerate(order)}
    ranks: dict[int, Rank] = {job_id: (i, -1, 0) for job_id, i in real.items()}
    if not templates:
        return ranks, []
    trial = replace(snapshot, pending=(*snapshot.pending, *templates))
    trial_order = policy.schedule(trial).order
    follows: dict[int, int] = {}
    last = -1
    for job_id in trial_order:
        if job_id in real:
            last = real[job_id]
        elif job_id < 0:
            follows[job_id] = last
    # An expected job the policy did not order (it would never be considered) goes last.
    end = len(order)
    return ranks, [follows.get(t.id, end) for t in templates]
