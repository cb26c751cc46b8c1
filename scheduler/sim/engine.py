"""The event loop: advance to the next event, run a scheduling cycle, apply what it decides.

Cycles run after every batch of events at the same instant (arrivals, completions) and every
`cycle_interval` simulated seconds while jobs wait, as the production cycle does on its timer.
Timer cycles that follow no event and decide nothing back off (2x, 4x... up to
`cycle_backoff` x the interval) until the next event or decision: in a long saturated stretch
a policy is asked again only every few minutes of simulated time instead of every minute,
which keeps replays of huge queues affordable. `cycle_backoff=1` turns this off.
Cycles that cannot decide anything are not run at all where that is exact for the policy
(`skip_rules`: nothing fits and the policy cannot preempt; or no news and its decisions do
not depend on the clock), so skipping never changes a run; `SimConfig.skip_exact=False`
runs them anyway. Plans carry no wait sentences (`SimConfig.explain`).
A production policy is driven exactly as the control worker drives it: build a `Snapshot`,
call `policy.schedule(snapshot)`, apply the plan's preemptions then its placements (every
member of a multi-node gang at once); a decision whose precondition no longer holds is
skipped and counted, never forced.
"""

from __future__ import annotations

import gc
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
        # A policy without these attributes is assumed to use the clock and to preempt.
        self.time_dependent = bool(getattr(policy, "time_dependent", True))
        self.policy_seconds = 0.0
        self.policy_cpu_seconds = 0.0  # time.process_time: steadier on a shared machine
        self.cycles = 0
        self.notes: dict[str, int] = {}

    def plan(self, state: SimState) -> Plan:
        snap = state.snapshot()
        t0, cpu0 = time.perf_counter(), time.process_time()
        plan = self.policy.schedule(snap)
        self.policy_cpu_seconds += time.process_time() - cpu0
        self.policy_seconds += time.perf_counter() - t0
        self.cycles += 1
        for note in plan.notes:
            key = note.split(":")[0][:60]
            self.notes[key] = self.notes.get(key, 0) + 1
        return plan

    def cycle(self, state: SimState) -> int:
        return apply_plan(state, self.plan(state))

    def may_preempt(self, settings: Any, guarantees: bool) -> bool:
        ask = getattr(self.policy, "may_preempt", None)
        return True if ask is None else bool(ask(settings, guarantees))


def skip_rules(driver: Any, jobs: list[JobSpec], config: SimConfig) -> tuple[bool, bool]:
    """(skip while nothing fits, skip timer cycles without news), each only where it is
    exact for this driver and run.

    - Nothing fits (no pending job fits the largest free block): a plan could only preempt,
      so skipping is exact when the policy cannot preempt under these settings (it says so
      through `may_preempt(settings, guarantees)`).
    - No news (no arrival, end or decision since a cycle that decided nothing): the next
      snapshot differs only in its clock, so skipping is exact when the policy's decisions
      do not depend on the clock (`time_dependent` false) and it cannot preempt.
    """
    may_preempt = getattr(driver, "may_preempt", None)
    if not config.skip_exact or may_preempt is None:
        return config.skip_when_full, False
    guarantees = any(g > 0 for g in config.team_guaranteed.values()) or any(
        j.gpu_equivalent <= 1e-6 for j in jobs
    )
    settings = {"explain": config.explain, "plan_waits": config.plan_waits, **config.settings}
    quiet = not may_preempt(settings, guarantees)
    static = quiet and not getattr(driver, "time_dependent", True)
    return config.skip_when_full or quiet, static


def apply_plan(state: SimState, plan: Plan) -> int:
    applied = 0
    for p in plan.preempts:
        why = state.preempt(p.job_id, requeue=p.requeue, reason=p.reason)
        if why:
            state.invalid_decisions.append(f"preempt {p.job_id}: {why}")
        else:
            applied += 1
    for place in plan.places:
        why = state.start(place.job_id, place.node, tuple(place.gpu_indices), place.members)
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
    policy_cpu_seconds: float = 0.0
    unschedulable: int = 0
    notes: dict[str, int] = field(default_factory=dict)


GC_YOUNG_EVERY = 1000  # simulator steps between collections of the young generations


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
    skip_full, skip_static = skip_rules(driver, jobs, config)
    news_since = True  # something changed since the last cycle that ran
    next_report = t_wall + 10.0
    total = len(jobs)
    # The loop makes many small objects a cycle and keeps most of them (jobs, records,
    # snapshots a policy carries over): the cyclic collector's full passes over that growing
    # heap cost 10-15 % of a replay and find next to nothing. So it is paused for the run,
    # with the young generations collected every GC_YOUNG_EVERY steps, as the production
    # cycle pauses it for a cycle (scheduler.cycle.runner).
    collecting = gc.isenabled()
    gc.disable()
    steps = 0
    try:
        while True:
            t_event = state.next_event_time()
            interval = config.cycle_interval * min(2**idle, config.cycle_backoff)
            t_tick = max(state.now, last_cycle + interval) if state.pending else math.inf
            t = min(t_event, t_tick)
            if t == math.inf:
                break
            news = state.advance(t)
            news_since = news_since or news
            skip = (skip_full and not state.could_place()) or (skip_static and not news_since)
            applied = driver.cycle(state) if state.pending and not skip else 0
            if state.pending:
                cycles += 0 if skip else 1
                last_cycle = state.now
                news_since = news_since and skip
            if applied:
                news_since = True
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
            steps += 1
            if steps % GC_YOUNG_EVERY == 0:
                gc.collect(1)
    finally:
        if collecting:
            gc.enable()
    result = SimResult(
        policy=driver.name,
        state=state,
        wall_seconds=time.perf_counter() - t_wall,
        cycles=cycles,
        unschedulable=unschedulable,
    )
    if isinstance(driver, PolicyDriver):
        result.policy_seconds = driver.policy_seconds
        result.policy_cpu_seconds = driver.policy_cpu_seconds
        result.notes = dict(driver.notes)
    return result
