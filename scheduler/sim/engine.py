"""The event loop: advance to the next event, run a scheduling cycle, apply what it decides.

Cycles run after every batch of events at the same instant (arrivals, completions) and every
`cycle_interval` simulated seconds while jobs wait, as the production cycle does on its timer.
Timer cycles that follow no event and decide nothing back off (2x, 4x... up to
`cycle_backoff` x the interval) until the next event or decision: in a long saturated stretch
a policy is asked again only every few minutes of simulated time instead of every minute,
which keeps replays of huge queues affordable. `cycle_backoff=1` turns this off.
A production policy is driven exactly as the control worker drives it: build a `Snapshot`,
call `policy.schedule(snapshot)`, apply the plan's preemptions then its placements; a decision
whose precondition no longer holds is skipped and counted, never forced.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from scheduler.core.model import Plan
from scheduler.sim.cluster import ClusterSpec
from scheduler.sim.jobs import JobSpec
from scheduler.sim.state import SimConfig, SimState

# Consecutive cycles with nothing running, nothing left to arrive and no decision after which
# the jobs still waiting are declared unschedulable (they ask for more than the cluster has,
# or the policy will never start them).
STUCK_CYCLES = 3


class Driver(Protocol):
    name: str

    def cycle(self, state: SimState) -> int:
        """Make decisions for the current instant; returns how many were applied."""
        ...


class PolicyDriver:
    """Drives a production policy object through snapshots and plans."""

    def __init__(self, policy: Any):
        self.policy = policy
        self.name = getattr(policy, "name", type(policy).__name__)
        self.policy_seconds = 0.0
        self.cycles = 0
        self.notes: dict[str, int] = {}

    def plan(self, state: SimState) -> Plan:
        snap = state.snapshot()
        t0 = time.perf_counter()
        plan = self.policy.schedule(snap)
        self.policy_seconds += time.perf_counter() - t0
        self.cycles += 1
        for note in plan.notes:
            key = note.split(":")[0][:60]
            self.notes[key] = self.notes.get(key, 0) + 1
        return plan

    def cycle(self, state: SimState) -> int:
        return apply_plan(state, self.plan(state))


def apply_plan(state: SimState, plan: Plan) -> int:
    applied = 0
    for p in plan.preempts:
        why = state.preempt(p.job_id, requeue=p.requeue, reason=p.reason)
        if why:
            state.invalid_decisions.append(f"preempt {p.job_id}: {why}")
        else:
            applied += 1
    for place in plan.places:
        why = state.start(place.job_id, place.node, tuple(place.gpu_indices))
        if why:
            state.invalid_decisions.append(f"place {place.job_id}: {why}")
        else:
            applied += 1
    return applied


@dataclass(slots=True)
class SimResult:
    policy: str
    state: SimState
    wall_seconds: float
    cycles: int
    policy_seconds: float = 0.0
    unschedulable: int = 0
    notes: dict[str, int] = field(default_factory=dict)


def simulate(
    jobs: list[JobSpec],
    cluster: ClusterSpec,
    driver: Driver,
    config: SimConfig | None = None,
    *,
    predictor: Any = None,
    progress: bool = False,
) -> SimResult:
    config = config or SimConfig()
    state = SimState(jobs, cluster, config)
    state.predictor = predictor
    t_wall = time.perf_counter()
    cycles = 0
    stuck = 0
    idle = 0  # timer cycles in a row with no event and no decision
    unschedulable = 0
    last_cycle = -math.inf
    next_report = t_wall + 10.0
    total = len(jobs)
    while True:
        t_event = state.next_event_time()
        interval = config.cycle_interval * min(2**idle, config.cycle_backoff)
        t_tick = max(state.now, last_cycle + interval) if state.pending else math.inf
        t = min(t_event, t_tick)
        if t == math.inf:
            break
        news = state.advance(t)
        skip = config.skip_when_full and not state.could_place()
        applied = driver.cycle(state) if state.pending and not skip else 0
        if state.pending:
            cycles += 0 if skip else 1
            last_cycle = state.now
        if applied:
            state._record()
        idle = 0 if (news or applied) else min(idle + 1, 30)
        if state.pending and not state.running and not state.arrivals_left and not applied:
            stuck += 1
            if stuck >= STUCK_CYCLES:
                unschedulable = state.mark_unschedulable()
        else:
            stuck = 0
        if progress and time.perf_counter() >= next_report:
            next_report += 10.0
            print(
                f"[{driver.name}] t={state.now / 86400:.1f} d, {state.finished}/{total} finished,"
                f" {len(state.pending)} waiting, {len(state.running)} running",
                file=sys.stderr,
                flush=True,
            )
    result = SimResult(
        policy=driver.name,
        state=state,
        wall_seconds=time.perf_counter() - t_wall,
        cycles=cycles,
        unschedulable=unschedulable,
    )
    if isinstance(driver, PolicyDriver):
        result.policy_seconds = driver.policy_seconds
        result.notes = dict(driver.notes)
    return result
