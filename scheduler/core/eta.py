"""Queue position and estimated start time of every pending job, and the submit form's
"would it start now?" estimate.

`estimate` plays the current plan forward: the plan's placements start now, every job ends
at its expected time (prediction when the snapshot carries one, else its time limit; one
already past it at the median learned share of its limit above what it has used; under
gittins the median of the learned runtimes instead of the predicted mean,
`scheduler.core.eta_runtimes`),
preempted jobs leave at once (before the plan's placements are booked) and the GPUs they
leave free go to the queue a scheduling minute later (the next cycle), the GPUs that
attempts still stopping hold (`Snapshot.holds`) come back when their holds expire, and at
each end the remaining queue is placed again by best fit within quotas (a multi-node gang
on all its nodes at once), in the policy's order (stopping at the first job that does not fit for a
blocking policy such as fcfs). Given `arrivals`, the submissions expected meanwhile join
the queue as they come, each where the policy ranks it (`scheduler.core.eta_arrivals`): a
short job expected in an hour goes ahead of a long one waiting now under gittins, as it
will. A job with a reservation is given at most its reserved start. Failures and the
policy's finer rules (packing searches, the preemptions of later cycles, re-ranking as jobs
age) are not simulated, so these are estimates.

The work is capped: at most `max_events` end events and `horizon` seconds ahead; jobs
still waiting then get no ETA. Each event costs one best fit per distinct request shape
plus a scan that stops as soon as no remaining shape fits, so 10,000 queued jobs cost a
few milliseconds per event.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right, insort
from dataclasses import replace
from itertools import count
from typing import Any

from scheduler.core.admission import admission_error
from scheduler.core.eta_arrivals import Arrivals, Rank
from scheduler.core.eta_arrivals import rank as rank_arrivals
from scheduler.core.eta_runtimes import Runtimes, for_policy
from scheduler.core.model import Member, Occupant, PendingJob, Plan, Snapshot
from scheduler.core.placement import FreeCapacity, Members
from scheduler.core.quota import QuotaLedger

DEFAULT_MAX_EVENTS = 500
DEFAULT_HORIZON = 30 * 86400.0
# Seconds from a preemption to the start of the job it makes room for: the victim stops and
# the next cycle places the waiting job (one scheduling minute).
DEFAULT_PREEMPT_DELAY = 60.0

Estimate = tuple[int, float | None, str]


def estimate(
    snapshot: Snapshot,
    policy: Any,
    *,
    plan: Plan | None = None,
    max_events: int = DEFAULT_MAX_EVENTS,
    horizon: float = DEFAULT_HORIZON,
    arrivals: Arrivals | None = None,
    preempt_delay: float = DEFAULT_PREEMPT_DELAY,
    runtimes: str | None = None,
    samples: int = 1,
    offset: float = 0.0,
) -> dict[int, Estimate]:
    """job id -> (queue position, estimated start or None, reason) for every pending job.
    `arrivals`: the submissions expected meanwhile (`scheduler.core.eta_arrivals`);
    `preempt_delay`: seconds until the GPUs the plan frees by preemption can be used;
    `runtimes`: how long jobs are played to run (`scheduler.core.eta_runtimes`: "predicted",
    "median" or "spread"; None: the policy's, `for_policy`); `samples`: with "spread", how many draws (quantiles shifted by
    `offset` + k / samples), each job given the median of its starts over them."""
    if plan is None:
        plan = policy.schedule(snapshot)
    if runtimes is None:
        runtimes = for_policy(policy)
    if samples > 1 and runtimes == "spread":
        draws = [
            estimate(
                snapshot,
                policy,
                plan=plan,
                max_events=max_events,
                horizon=horizon,
                arrivals=arrivals,
                preempt_delay=preempt_delay,
                runtimes=runtimes,
                offset=offset + k / samples,
            )
            for k in range(samples)
        ]
        return _median_start(draws)
    now = snapshot.now
    pending = {j.id: j for j in snapshot.pending}
    position = {job_id: i + 1 for i, job_id in enumerate(plan.order)}
    for job_id in pending:
        position.setdefault(job_id, len(position) + 1)
    reasons = {w.job_id: w.reason for w in plan.waits}
    reserved = {r.job_id: r.start for r in plan.reserves}
    out: dict[int, Estimate] = {}

    cap = FreeCapacity.from_snapshot(snapshot)
    quota = QuotaLedger.from_snapshot(snapshot)
    ends: list[tuple[float, int, Any, Members]] = []
    seq = count()
    preempted = {p.job_id for p in plan.preempts}
    ratios = sorted(snapshot.limit_ratio_distribution)
    played = Runtimes(ratios, runtimes, offset)
    for r in snapshot.running:
        if r.id in preempted:
            # Its GPUs go to the plan's placements, which are booked next: release them
            # first, or the forecast would hand them out twice.
            cap.release_members(r, r.allocations)
            quota.release(r)
            continue
        end = played.end(r, now)
        if end is None:
            end = _expected_end(r, now, ratios)
        heapq.heappush(ends, (end, next(seq), r, r.allocations))
    for hold in snapshot.holds:
        # A stopping attempt gives its GPUs back when it ends, by its expiry at the latest.
        end = hold.end if hold.end > now else now
        heapq.heappush(ends, (end, next(seq), hold, (Member(hold.node, hold.gpu_indices),)))
    for place in plan.places:
        job = pending.get(place.job_id)
        if job is None:
            continue
        members = place.allocations
        where = ", ".join(m.node for m in members)
        out[job.id] = (position[job.id], now, f"starts now on {where}")
        if cap.fits_members(job, members):
            cap.take_members(job, members)
        quota.take(job)
        heapq.heappush(ends, (now + played.runtime(job), next(seq), job, members))
    if plan.preempts:
        # The GPUs the plan frees by preemption go to the queue once the victims have
        # stopped, not at the next end: an event that releases nothing more.
        heapq.heappush(ends, (now + preempt_delay, next(seq), None, ()))

    remaining: list[tuple[Rank, PendingJob]]
    if arrivals is not None and arrivals.recent:
        templates = arrivals.templates()
        ranks, follows = rank_arrivals(snapshot, policy, plan.order, templates)
        stream = arrivals.stream(now, templates)
    else:
        ranks = {job_id: (i, -1, 0) for i, job_id in enumerate(plan.order)}
        follows, stream = [], iter(())
    remaining = sorted(
        (ranks.get(job_id, (len(ranks), -1, job_id)), pending[job_id])
        for job_id in pending
        if job_id not in out
    )
    real_left = len(remaining)
    # Expected jobs ranked behind every real one still waiting cannot delay one: left out.
    last_real = remaining[-1][0] if remaining else (-1, -1, 0)
    blocking = bool(getattr(policy, "blocking", False))
    events = 0
    coming = next(stream, None)
    while real_left and events < max_events:
        t = min(ends[0][0] if ends else math.inf, coming[0] if coming else math.inf)
        if t - now > horizon:  # also when nothing is left to happen (inf)
            break
        released = bool(ends) and ends[0][0] <= t
        while ends and ends[0][0] <= t:
            _, _, job, members = heapq.heappop(ends)
            if job is not None:
                cap.release_members(job, members)
                if not isinstance(job, Occupant):  # (a hold counts against no quota)
                    quota.release(job)
        new: list[tuple[Rank, PendingJob]] = []
        while coming is not None and coming[0] <= t:
            _, copy, i, job = coming
            item = ((follows[i], copy, i), job)
            coming = next(stream, None)
            if item[0] < last_real:
                insort(remaining, item, key=_rank_of)
                new.append(item)
        if released:
            events += 1
        # Only an end frees GPUs: after submissions alone, only the new jobs may start.
        candidates = remaining if released else new
        live = cap.shapes_that_fit([job for _, job in candidates])
        if not live:
            continue
        if blocking and not released:
            first = remaining[0][0]
            candidates = [item for item in candidates if item[0] == first]
        started: set[int] = set()
        for _, job in candidates:
            if not live:
                break
            shape = FreeCapacity.shape(job)
            choice = None
            if shape in live and quota.check(job) is None:
                choice = cap.best_fit_members(job)
                if choice is None:
                    live.discard(shape)
            if choice is None:
                if blocking:
                    break
                continue
            cap.take_members(job, choice)
            quota.take(job)
            started.add(id(job))
            if job.id in pending:
                out[job.id] = (position[job.id], t, reasons.get(job.id, ""))
                real_left -= 1
            heapq.heappush(ends, (t + played.runtime(job), next(seq), job, choice))
        if started:
            remaining = [item for item in remaining if id(item[1]) not in started]
            while remaining and remaining[-1][0][1] >= 0:  # an expected job (real: -1)
                remaining.pop()
            last_real = remaining[-1][0] if remaining else last_real

    capped = "; no estimate within the forecast window"
    for _, job in remaining:
        if job.id in pending:
            out[job.id] = (position[job.id], None, reasons.get(job.id, "") + capped)
    for job_id, start in reserved.items():
        if job_id in out:
            pos, eta, reason = out[job_id]
            out[job_id] = (pos, start if eta is None else min(eta, start), reason)
    for job_id in pending:
        out.setdefault(job_id, (position[job_id], None, reasons.get(job_id, "")))
    return out


def _median_start(draws: list[dict[int, Estimate]]) -> dict[int, Estimate]:
    """Each job's median start over forecasts of the same plan (no estimate counts as
    latest); position and reason from the first."""
    out: dict[int, Estimate] = {}
    for job_id, (pos, _, reason) in draws[0].items():
        starts: list[float] = []
        for draw in draws:
            start = draw[job_id][1]
            starts.append(math.inf if start is None else start)
        mid = sorted(starts)[len(starts) // 2]
        out[job_id] = (pos, None if math.isinf(mid) else mid, reason)
    return out


def _rank_of(item: tuple[Rank, PendingJob]) -> Rank:
    return item[0]


def _expected_end(job: Any, now: float, ratios: list[float]) -> float:
    """When a running job is expected to end. One already past its predicted end is not
    about to end "now" (that would promise the jobs behind it a start that keeps slipping):
    given that it has run this long, it is expected to use the median of the learned
    actual/limit ratios above the share of its limit it has used (equal-mass atoms; the
    median, as a heavy tail would put the mean far out), or its whole limit when none is
    above, or with no history."""
    end = float(job.expected_end)
    if end > now or job.time_limit <= 0:
        return max(end, now)
    used = (now - job.started_at) / job.time_limit
    above = ratios[bisect_right(ratios, used) :] if ratios else []
    share = above[len(above) // 2] if above else 1.0
    return max(job.started_at + min(share, 1.0) * job.time_limit, now)


def what_if(
    snapshot: Snapshot, policy: Any, job: PendingJob
) -> tuple[bool, str | None, float | None, str]:
    """(would start now, node, estimated start, reason) for a job not yet submitted."""
    error = admission_error(job, snapshot.nodes, snapshot.teams.get(job.team))
    if error is not None:
        return False, None, None, error
    trial = replace(snapshot, pending=(*snapshot.pending, job))
    plan = policy.schedule(trial)
    for place in plan.places:
        if place.job_id == job.id:
            where = ", ".join(m.node for m in place.allocations)
            return True, place.node, snapshot.now, f"would start now on {where}"
    position, eta, reason = estimate(trial, policy, plan=plan)[job.id]
    return False, None, eta, f"would be number {position} in the queue: {reason}"
