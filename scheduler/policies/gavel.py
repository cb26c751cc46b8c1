"""gavel: least attained service that places each job on the GPU model where it runs best
relative to the other waiting jobs, in the spirit of Gavel.

Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep Learning
Workloads", OSDI'20: a job's effective throughput is its throughput on the GPU type it gets,
and jobs differ in how much a faster type helps them (a language model may run 60x faster on
a V100 than on a K80, a recommendation model 2x). Gavel solves an allocation of time on
each type per job and realises it in rounds. fleet's cycle keeps its own model (one walk of
the queue per cycle, no per-round leases), so `gavel` is the practical subset:

- order and preemption are `las`'s (discretized least attained service, preemption that
  pays for itself);
- each cycle, the jobs at the head of that order that the free GPUs could hold form the
  round; they are assigned to GPU models by a greedy solution of the round's assignment
  (Vogel's rule: the job that would lose the most GPU-seconds by not getting its best model
  with room left, its GPUs x expected runtime x the extra time the next best model takes,
  chooses first and takes that model);
- a job is placed on its assigned model when it fits there, else on the next best that
  fits, unless its relative speed there is below settings "gavel_min_speed" (default
  0.25: a job does not start where it would run over 4x slower than on its best model; it
  waits, or preempts, for a better one; 0 makes it work-conserving); jobs past the round
  try their models fastest first.

Speeds come from the snapshot: the job's own (`PendingJob.gpu_speeds`, declared; a model
it does not name runs it at 1.0), else those learned for its class (job name, else its
user) from finished jobs' runtimes per GPU model (`Snapshot.gpu_speeds`, built by
`SpeedLearner`). A model its class has not been learned on counts as speed 0: below
"gavel_min_speed", so the job waits for a model it is known to run well on rather than
risk one that may run it 60x slower. A job with neither has no preference and is placed as
`las` places it (which is how its class gets learned). Where no job of the round has speeds
that differ between the free models, `gavel` places exactly as `las` does.

Trade-off: faster JCT and more work done on a mixed fleet where jobs differ in their
speedups; but it needs those speedups (declared, or learned from enough finished jobs of
each class on each model), it does not migrate running jobs to better models (a job moves
only when a preemption requeues it), and on a fleet of one model it is `las`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from scheduler.core.model import PendingJob, Plan, Snapshot
from scheduler.policies.base import Cycle
from scheduler.policies.las import LasPolicy

# Jobs of a class that must have finished on a model before its speed there is learned
# (runtime / limit varies by 2x and more between jobs of one class).
MIN_SAMPLES = 10
# Jobs in one round at most (its assignment costs jobs^2 x models); later jobs try their
# models fastest first.
MAX_ROUND = 128
# Relative speed below which a job rather waits for a better model than start (settings
# "gavel_min_speed"): at most 4x slower than on its best model.
DEFAULT_MIN_SPEED = 0.25

Speeds = Mapping[str, Mapping[str, float]]
# (model, speed relative to the job's best model), best first.
Preference = tuple[tuple[str, float], ...]


def speed_key(user: str, name: str) -> str:
    """The class a job's speeds are learned for: its name (the command it runs), else its
    user ("@" + user)."""
    return name if name else f"@{user}"


class SpeedLearner:
    """Relative speed per (job class, GPU model), learned from finished jobs' runtimes.

    A job's runtime says little by itself (jobs of one class differ in size), so each is
    taken against its time limit: runtime / limit, whose geometric mean per class and model
    compares the models for that class, assuming people ask limits for the work, not for the
    GPU they will get. The fastest model of a class has speed 1.0; a model needs
    `min_samples` finished jobs, and a class two such models. Incremental (`observe`), with the table rebuilt only after a change.
    """

    def __init__(self, min_samples: int = MIN_SAMPLES) -> None:
        self.min_samples = min_samples
        self._sums: dict[str, dict[str, list[float]]] = {}
        self._table: Speeds | None = None

    def observe(self, key: str, model: str, runtime: float, limit: float) -> None:
        if not model or not (runtime > 0 and limit > 0):
            return
        value = math.log(runtime / limit)
        cell = self._sums.setdefault(key, {}).setdefault(model, [0.0, 0.0])
        cell[0] += value
        cell[1] += 1
        self._table = None

    def table(self) -> Speeds:
        if self._table is None:
            out: dict[str, Mapping[str, float]] = {}
            for key, per_model in self._sums.items():
                means = {m: s / n for m, (s, n) in per_model.items() if n >= self.min_samples}
                if len(means) < 2:
                    continue
                fastest = min(means.values())
                out[key] = MappingProxyType(
                    {m: math.exp(fastest - v) for m, v in sorted(means.items())}
                )
            self._table = MappingProxyType(out)
        return self._table


def job_speeds(job: PendingJob, table: Speeds, models: tuple[str, ...]) -> dict[str, float] | None:
    """The job's speed on each model: declared (1.0 on a model it does not name), else
    learned for its class (0.0 on a model the class has not been learned on); None when
    neither is known."""
    if job.gpu_speeds:
        declared = dict(job.gpu_speeds)
        return {m: float(declared.get(m, 1.0)) for m in models}
    row = table.get(speed_key(job.user, job.name))
    if not row:
        return None
    return {m: float(row.get(m, 0.0)) for m in models}


def preference(speeds: Mapping[str, float] | None) -> Preference | None:
    """Models best first with the speed relative to the best; None when all are equal."""
    if not speeds:
        return None
    best = max(speeds.values())
    if best <= 0 or min(speeds.values()) == best:
        return None
    ranked = sorted(speeds.items(), key=lambda item: (-item[1], item[0]))
    return tuple((model, speed / best) for model, speed in ranked)


def _need(job: PendingJob) -> float:
    return float(job.gpus) if job.gpus else job.gpu_equivalent


def plan_round(snapshot: Snapshot, ordered: list[PendingJob]) -> dict[int, Preference]:
    """Each job of the round (the head of `ordered` that the free GPUs could hold) with its
    models in the order to try: the one the round assigns it first. Empty when the fleet has
    one model or no job of the round prefers one."""
    free: dict[str, int] = {}
    for node in snapshot.nodes:
        if node.schedulable:
            for gpu in node.gpus:
                free.setdefault(gpu.model, 0)
                if gpu.is_whole_free:
                    free[gpu.model] += 1
    models = tuple(sorted(free))
    total = sum(free.values())
    if len(models) < 2 or total == 0:
        return {}
    table = snapshot.gpu_speeds
    head: list[tuple[PendingJob, Preference]] = []
    uniform = tuple((m, 1.0) for m in models)
    need = 0.0
    any_prefers = False
    for job in ordered:
        if need >= total or len(head) >= MAX_ROUND:
            break
        if job.gpu_model is not None:
            continue
        pref = preference(job_speeds(job, table, models))
        any_prefers = any_prefers or pref is not None
        head.append((job, pref or uniform))
        need += _need(job)
    if not any_prefers:
        return {}

    left = dict(free)
    out: dict[int, Preference] = {}
    waiting = list(range(len(head)))
    while waiting:
        # Vogel's rule: the job that loses most if it does not get its best model among
        # those with room left chooses next (ties in queue order). The loss is in GPU-seconds:
        # its GPUs x its expected runtime x how much longer the next best model takes; a
        # job with one model left would lose it all.
        pick, pick_key, pick_model = waiting[0], (math.inf, 0), None
        for i in waiting:
            job, pref = head[i]
            want = _need(job)
            room = [(model, speed) for model, speed in pref if speed > 0 and left[model] >= want]
            if not room:
                key: tuple[float, int] = (1.0, i)
            elif len(room) == 1:
                key = (-math.inf, i)
            else:
                stretch = 1.0 / room[1][1] - 1.0 / room[0][1]
                key = (-stretch * want * max(job.expected_runtime, 1.0), i)
            if key < pick_key:
                pick, pick_key, pick_model = i, key, room[0][0] if room else None
        waiting.remove(pick)
        job, pref = head[pick]
        if pick_model is None:
            out[job.id] = pref
            continue
        left[pick_model] -= int(math.ceil(_need(job)))
        out[job.id] = (
            (pick_model, dict(pref)[pick_model]),
            *(p for p in pref if p[0] != pick_model),
        )
    return out


class _GavelCycle(Cycle):
    """A cycle that tries each job on its models in the order given before the plain best fit."""

    def __init__(
        self,
        snapshot: Snapshot,
        policy: str,
        *,
        planned: dict[int, Preference],
        min_speed: float,
        **flags: Any,
    ) -> None:
        super().__init__(snapshot, policy, **flags)
        self.planned = planned
        self.min_speed = min_speed
        self.models = tuple(sorted({g.model for n in snapshot.nodes for g in n.gpus}))
        self.pinned = 0

    def _preference(self, job: PendingJob) -> Preference | None:
        if job.gpu_model is not None or len(self.models) < 2:
            return None
        pref = self.planned.get(job.id)
        if pref is None:
            pref = preference(job_speeds(job, self.snapshot.gpu_speeds, self.models))
        return pref

    def consider(self, job: PendingJob) -> bool:
        if job.id in self._seen:
            return False
        pref = self._preference(job)
        if pref is None:
            return super().consider(job)
        allowed = [model for model, speed in pref if speed >= self.min_speed] or [pref[0][0]]
        gang = job.gpus_per_node and job.gpus > job.gpus_per_node
        for model in allowed:
            pinned = replace(job, gpu_model=model)
            fits = self.cap.best_fit_members(pinned) if gang else self.cap.best_fit(pinned)
            if fits is not None:
                self.pinned += 1
                return super().consider(pinned)
        if len(allowed) < len(pref):
            # Too slow anywhere else: it waits (or preempts) for a model it runs well on.
            return super().consider(replace(job, gpu_model=allowed[0]))
        return super().consider(job)


class GavelPolicy(LasPolicy):
    """`las` order and preemption; placement by each job's speed per GPU model (see the
    module). Settings: those of `las`, and "gavel_min_speed" (0..1, default 0.25)."""

    name = "gavel"

    def __init__(self, min_speed: float | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.min_speed = min_speed

    def schedule(self, snapshot: Snapshot) -> Plan:
        # The victim rule is las's (scheduler/policies/las.py), with the cycle that places
        # by speed.
        min_speed = self.min_speed
        if min_speed is None:
            value = snapshot.settings.get("gavel_min_speed")
            min_speed = DEFAULT_MIN_SPEED if value is None else float(value)

        victims = self.queue_victims(snapshot)
        ordered = self.order(snapshot)
        planned = plan_round(snapshot, ordered)
        preempt = bool(snapshot.settings.get("las_preemption", True))
        cycle = _GavelCycle(
            snapshot,
            self.name,
            planned=planned,
            min_speed=min_speed,
            preempt=True,
            victim_rule=victims.rule if preempt else None,
            rule_key=victims.key,
            victim_filter=victims.filter(),
            rule_hint=victims.hint(),
        )
        cycle.consider_all(ordered)
        notes = (
            (f"gavel: {len(planned)} jobs in the round assigned to GPU models",) if planned else ()
        )
        return cycle.plan(notes)
