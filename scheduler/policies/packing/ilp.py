"""`ilp`: place the most valuable set of pending jobs, packed tightly, by an integer program.

Value is priority/age/team weight times size (see `_values`). The model (`_ilp_model`) works
over classes of identical capacity (slots of wholly free GPUs of one kind and count, partly
used GPUs with the same room), so its size follows the distinct shapes of the fleet, not
its node count; its objective is the placed value less a small packing term (the
fragmentation scorer's rise, as the placement uses; docs/packing.md). HiGHS solves it
under work limits (branch-and-bound nodes and leaves), so a snapshot always gives the same
plan; the wall-clock limit is a safety net. Gangs are decoded onto concrete GPUs in name
and index order; the chosen fractions both on the solver's GPUs and where the placement
puts them, keeping the decoding that scores higher; then any capacity still free is
offered to the remaining jobs by best fit.

The plan never falls back silently: when the problem is above the size limits, the solver
finds no solution within its limits, the plan is greedy's and its notes say why ("ilp: fell
back to greedy: ..."). When the solver's plan, once decoded, scores lower than greedy's on
the solver's own objective (value less packing term; it can, as the fractions' packing is
relaxed and their candidates bounded), greedy's plan is kept and the notes say that too; a
work limit that stops the search after a solution was found, and choices the decoding
could not map, are noted. The cycle records the notes.

Settings (snapshot.settings or constructor keywords; the `ilp_` prefix may be dropped in
keywords): `ilp_max_bb_nodes` (2000, HiGHS `mip_max_nodes`), `ilp_max_leaves` (1000,
`mip_max_leaves`), `ilp_time_limit` (s, 10: the safety net), `ilp_max_jobs` (2000), `ilp_max_nodes` (5000),
`ilp_max_variables` (200,000), `ilp_packing` (true: the packing term), plus the value
weights of `_values`.

The model knows GPUs only: multi-node gangs, and jobs asking for host CPUs or memory on a
fleet that reports them, are left out of it and placed by best fit after the solver's
choices, with a note saying so.
"""

from __future__ import annotations

from typing import Any

from scheduler.core.model import NodeState, PendingJob, Place, Plan, Snapshot
from scheduler.core.placement import FreeCapacity
from scheduler.core.quota import QuotaLedger
from scheduler.policies.packing._common import finish_plan
from scheduler.policies.packing._decode import place_in_order
from scheduler.policies.packing._ilp_model import (
    IlpResult,
    Limits,
    PackingTerm,
    packing_cost,
    solve,
)
from scheduler.policies.packing._values import greedy_order, job_values, setting, value_order

_DEFAULTS = {
    "ilp_time_limit": 10.0,
    "ilp_max_bb_nodes": 2000,
    "ilp_max_leaves": 1000,
    "ilp_max_jobs": 2000,
    "ilp_max_nodes": 5000,
    "ilp_max_variables": 200_000,
    "ilp_packing": True,
}
_EPS = 1e-6


def _headroom(snapshot: Snapshot, ledger: QuotaLedger, jobs: list[PendingJob]):
    teams: dict[str, float] = {}
    users: dict[tuple[str, str], float] = {}
    for job in jobs:
        team = snapshot.teams.get(job.team)
        if team is None:
            continue
        if team.hard_limit_gpus is not None:
            teams[job.team] = max(0.0, team.hard_limit_gpus - ledger.usage(job.team)) + _EPS
        if team.user_gpu_cap is not None:
            room = team.user_gpu_cap - ledger.user(job.team, job.user)
            users[(job.team, job.user)] = max(0.0, room) + _EPS
    return teams, users


def _outside_notes(snapshot: Snapshot, cap: FreeCapacity) -> list[str]:
    outside = [j.id for j in snapshot.pending if _outside_model(j, cap)]
    if not outside:
        return []
    return [
        f"ilp: {len(outside)} jobs spanning several nodes or asking for host CPUs or memory "
        f"are placed by best fit, outside the solver's model: {outside}"
    ]


def _outside_model(job: PendingJob, cap: FreeCapacity) -> bool:
    """Whether the model cannot place the job: a multi-node gang, or host needs on a fleet
    whose nodes report host CPUs or memory."""
    if job.gpus_per_node and job.gpus > job.gpus_per_node:
        return True
    return bool(job.cpus or job.memory_mb) and cap.host_limited()


class IlpPolicy:
    name = "ilp"

    def __init__(self, **params: Any) -> None:
        self.params = {
            (k if k.startswith("ilp_") or f"ilp_{k}" not in _DEFAULTS else f"ilp_{k}"): v
            for k, v in params.items()
        }
        # Figures of the last solve, for benchmarks and the cycle's log.
        self.last: IlpResult | None = None

    def _setting(self, snapshot: Snapshot, key: str) -> Any:
        return setting(self.params, snapshot, key, _DEFAULTS[key])

    def limits(self, snapshot: Snapshot) -> Limits:
        return Limits(
            max_bb_nodes=int(self._setting(snapshot, "ilp_max_bb_nodes")),
            max_leaves=int(self._setting(snapshot, "ilp_max_leaves")),
            time_limit=float(self._setting(snapshot, "ilp_time_limit")),
        )

    def schedule(self, snapshot: Snapshot) -> Plan:
        values = job_values(snapshot, self.params)
        order = value_order(snapshot.pending, values)
        greedy_plan = self._greedy(snapshot)

        model = self.model_inputs(snapshot, values)
        jobs, nodes = model["jobs"], model["nodes"]
        self.last = None
        max_jobs = int(self._setting(snapshot, "ilp_max_jobs"))
        max_nodes = int(self._setting(snapshot, "ilp_max_nodes"))
        if len(jobs) > max_jobs or len(nodes) > max_nodes:
            why = (
                f"{len(jobs)} placeable jobs x {len(nodes)} nodes is above the size limit "
                f"({max_jobs} x {max_nodes})"
            )
            return self._fallback(snapshot, greedy_plan, order, why)
        if not jobs:
            return self._fallback(snapshot, greedy_plan, order, None)

        limits = self.limits(snapshot)
        scorer = model.pop("scorer")
        term = PackingTerm(scorer) if self._setting(snapshot, "ilp_packing") else None
        result = solve(
            **model,
            limits=limits,
            max_variables=int(self._setting(snapshot, "ilp_max_variables")),
            packing=term,
        )
        self.last = result
        if result.status == "too_large":
            why = f"the model has {result.message}, above the size limit"
            return self._fallback(snapshot, greedy_plan, order, why)
        if result.status == "none":
            if result.limit is not None:
                why = f"no solution within the {_limit_text(result, limits)} ({result.message})"
            else:
                why = f"the solver found no solution ({result.message})"
            return self._fallback(snapshot, greedy_plan, order, why)

        fractional = {j.id: j for j in snapshot.pending if j.is_fractional}
        # Two decodings of the fractions: on the solver's GPUs, and where the placement
        # puts them; the one scoring higher on the solver's objective is kept.
        best: tuple[float, list[Place], FreeCapacity, QuotaLedger, list[str]] | None = None
        for by_placement in (False, True):
            cap = FreeCapacity.from_snapshot(snapshot)
            ledger = QuotaLedger.from_snapshot(snapshot)
            notes: list[str] = _outside_notes(snapshot, cap)
            places = self._map(result, cap, ledger, order, notes, by_placement)
            placed = {p.job_id for p in places}
            rest = [j for j in greedy_order(snapshot.pending) if j.id not in placed]
            places += place_in_order(rest, cap, ledger, "best fit after ilp")
            score = self._score(places, values, nodes, term, fractional)
            if best is None or score > best[0] + _EPS:
                best = (score, places, cap, ledger, notes)
            if not result.fractions:
                break
        assert best is not None
        ilp_score, places, cap, ledger, notes = best
        if result.status == "feasible":
            bound = result.dual_bound
            gap = f"{result.mip_gap:.1%}" if result.mip_gap is not None and bound else "unknown"
            notes.append(
                f"ilp: stopped at the {_limit_text(result, limits)}; kept the best solution "
                f"found (gap {gap} to the solver's bound) and filled what was left by best fit"
            )
        greedy_score = self._score(greedy_plan[0], values, nodes, term, fractional)
        if greedy_score > ilp_score + _EPS:
            note = (
                f"ilp: solved ({result.status}), but kept greedy's plan: it scores "
                f"{greedy_score:.3f} (value less packing term), the solver's plan {ilp_score:.3f}"
            )
            return self._fallback(snapshot, greedy_plan, order, None, [note])
        return finish_plan(self.name, snapshot, cap, ledger, places, order, notes)

    @staticmethod
    def _score(
        places: list[Place],
        values: dict[int, float],
        nodes: list[NodeState],
        term: PackingTerm | None,
        fractional: dict[int, PendingJob],
    ) -> float:
        """Placed value less the model's packing term for these places."""
        value = sum(values[p.job_id] for p in places)
        if term is None:
            return value
        gangs: dict[int, tuple[str, tuple[int, ...]]] = {}
        fractions: dict[int, tuple[str, int, int, int]] = {}
        for p in places:
            if p.members:
                continue
            job = fractional.get(p.job_id)
            if job is not None:
                q, mb = job.gpu_compute_percent or 0, job.gpu_memory_mb or 0
                fractions[p.job_id] = (p.node, p.gpu_indices[0], q, mb)
            else:
                gangs[p.job_id] = (p.node, p.gpu_indices)
        return value - packing_cost(term, nodes, gangs, fractions)

    @staticmethod
    def model_inputs(snapshot: Snapshot, values: dict[int, float]) -> dict[str, Any]:
        """Keyword arguments of `_ilp_model.solve` (less limits) for this snapshot: the jobs
        that could start on their own (room and quota), in value order, and the
        schedulable nodes."""
        cap = FreeCapacity.from_snapshot(snapshot)
        ledger = QuotaLedger.from_snapshot(snapshot)
        order = value_order(snapshot.pending, values)
        jobs = [
            j
            for j in order
            if not _outside_model(j, cap)
            and ledger.check(j) is None
            and cap.best_fit(j) is not None
        ]
        teams, users = _headroom(snapshot, ledger, jobs)
        return {
            "jobs": jobs,
            "values": values,
            "nodes": [n for n in snapshot.nodes if n.schedulable],
            "eligible": cap.eligible,
            "team_headroom": teams,
            "user_headroom": users,
            "scorer": cap.scorer(),
        }

    @staticmethod
    def _map(
        result: IlpResult,
        cap: FreeCapacity,
        ledger: QuotaLedger,
        order: list[PendingJob],
        notes: list[str],
        by_placement: bool,
    ) -> list[Place]:
        """Book the solver's choices: gangs on their concrete GPUs, then the chosen fractions
        on the solver's GPUs, or (`by_placement`) where the placement puts them; the other
        way when the first finds none. A gang that does not fit (never expected) and
        fractions left without a GPU are noted."""
        places: list[Place] = []
        lost: list[int] = []
        unplaced = list(result.unmapped)
        for job in order:
            where = result.gangs.get(job.id)
            if where is None:
                continue
            node, indices = where
            if cap.fits(job, node, indices) and ledger.check(job) is None:
                cap.take(job, node, indices)
                ledger.take(job)
                places.append(Place(job.id, node, indices, "ilp"))
            else:
                lost.append(job.id)
        for job in order:
            spot = result.fractions.get(job.id)
            if spot is None:
                continue
            if ledger.check(job) is not None:
                lost.append(job.id)
                continue
            solver = (spot[0], (spot[1],)) if cap.fits(job, spot[0], (spot[1],)) else None
            if by_placement:
                choice = cap.best_fit(job) or solver
            else:
                choice = solver or cap.best_fit(job)
            if choice is None:
                unplaced.append(job.id)
                continue
            cap.take(job, *choice)
            ledger.take(job)
            places.append(Place(job.id, choice[0], choice[1], "ilp"))
        if lost:
            notes.append(f"ilp: {len(lost)} solver choices did not map onto free GPUs: {lost}")
        if unplaced:
            notes.append(
                f"ilp: {len(unplaced)} fractions chosen by the solver found no GPU when "
                "decoded (their packing is relaxed in the model); offered what is left by "
                "best fit"
            )
        return places

    @staticmethod
    def _greedy(snapshot: Snapshot) -> tuple[list[Place], FreeCapacity, QuotaLedger]:
        cap = FreeCapacity.from_snapshot(snapshot)
        ledger = QuotaLedger.from_snapshot(snapshot)
        places = place_in_order(greedy_order(snapshot.pending), cap, ledger, "best fit")
        return places, cap, ledger

    def _fallback(
        self,
        snapshot: Snapshot,
        greedy_plan: tuple[list[Place], FreeCapacity, QuotaLedger],
        order: list[PendingJob],
        why: str | None,
        kept: list[str] | None = None,
    ) -> Plan:
        places, cap, ledger = greedy_plan
        notes = [f"ilp: fell back to greedy: {why}"] if why else list(kept or [])
        notes += _outside_notes(snapshot, cap)
        return finish_plan(self.name, snapshot, cap, ledger, places, order, notes)


def _limit_text(result: IlpResult, limits: Limits) -> str:
    if result.limit == "time":
        return f"{limits.time_limit:g} s time limit (safety net)"
    return (
        f"work limit of {limits.max_bb_nodes} branch-and-bound nodes or {limits.max_leaves} leaves"
    )
