"""`ilp`: place the most valuable set of pending jobs by solving an integer program.

Value is priority/age/team weight times size (see `_values`). The model (`_ilp_model`) is
solved by HiGHS through scipy.optimize.milp under a time limit. Its node-level answer is
turned into concrete GPUs with FreeCapacity, then any capacity still free is offered to the
remaining jobs by best fit. The plan falls back to greedy, with a note saying why, when the
problem is above the size limits or the solver finds no feasible solution in time; it also
keeps the greedy plan when that is worth more than an unfinished solve.

Settings (snapshot.settings or constructor keywords; the `ilp_` prefix may be dropped in
keywords): `ilp_time_limit` (s, default 1), `ilp_max_jobs` (2000), `ilp_max_nodes` (200),
`ilp_max_variables` (600000), `ilp_exact_variables` (20000: above it fractions may start
only one wholly free GPU per node), plus the value weights of `_values`.

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
from scheduler.policies.packing._ilp_model import IlpResult, solve
from scheduler.policies.packing._values import greedy_order, job_values, setting, value_order

_DEFAULTS = {
    "ilp_time_limit": 1.0,
    "ilp_max_jobs": 2000,
    "ilp_max_nodes": 200,
    "ilp_max_variables": 600_000,
    "ilp_exact_variables": 20_000,
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

    def schedule(self, snapshot: Snapshot) -> Plan:
        values = job_values(snapshot, self.params)
        order = value_order(snapshot.pending, values)
        greedy_plan = self._greedy(snapshot)
        greedy_value = sum(values[p.job_id] for p in greedy_plan[0])

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

        time_limit = float(self._setting(snapshot, "ilp_time_limit"))
        result = solve(
            **model,
            time_limit=time_limit,
            max_variables=int(self._setting(snapshot, "ilp_max_variables")),
            exact_variables=int(self._setting(snapshot, "ilp_exact_variables")),
        )
        self.last = result
        if result.status == "too_large":
            why = f"the model has {result.message}, above the size limit"
            return self._fallback(snapshot, greedy_plan, order, why)
        if result.status == "none":
            why = f"no feasible solution within the {time_limit:g} s time limit ({result.message})"
            return self._fallback(snapshot, greedy_plan, order, why)

        cap = FreeCapacity.from_snapshot(snapshot)
        ledger = QuotaLedger.from_snapshot(snapshot)
        notes: list[str] = list(result.notes) + _outside_notes(snapshot, cap)
        places = self._map(result, {n.name: n for n in nodes}, cap, ledger, order, notes)
        placed = {p.job_id for p in places}
        rest = [j for j in greedy_order(snapshot.pending) if j.id not in placed]
        places += place_in_order(rest, cap, ledger, "best fit after ilp")
        ilp_value = sum(values[p.job_id] for p in places)
        if result.status == "feasible":
            bound = result.dual_bound
            gap = f"{(bound - ilp_value) / bound:.1%}" if bound else "unknown"
            notes.append(
                f"ilp: time limit of {time_limit:g} s hit; kept the best solution found and "
                f"filled what was left by best fit (within {gap} of the solver's bound)"
            )
        if greedy_value > ilp_value + _EPS:
            why = f"greedy is worth {greedy_value:.2f}, the solver's best {ilp_value:.2f}"
            return self._fallback(snapshot, greedy_plan, order, why)
        return finish_plan(self.name, snapshot, cap, ledger, places, order, notes)

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
        }

    @staticmethod
    def _map(
        result: IlpResult,
        nodes: dict[str, NodeState],
        cap: FreeCapacity,
        ledger: QuotaLedger,
        order: list[PendingJob],
        notes: list[str],
    ) -> list[Place]:
        """Concrete GPUs for the solver's choices: fractions on their GPU, then each gang on
        the lowest wholly free GPUs of its slot that fractions did not open."""
        places: list[Place] = []
        lost: list[int] = []
        for job in order:
            where = result.fractions.get(job.id)
            if where is None:
                continue
            node, index = where
            if cap.fits(job, node, (index,)) and ledger.check(job) is None:
                cap.take(job, node, (index,))
                ledger.take(job)
                places.append(Place(job.id, node, (index,), "ilp"))
            else:
                lost.append(job.id)
        gangs = [j for j in order if j.id in result.gangs]
        gangs.sort(key=lambda j: -j.gpus)
        for job in gangs:
            slot = result.gangs[job.id]
            free = set(cap.whole_free(slot.node))
            indices = tuple(i for i in slot.indices if i in free)[: job.gpus]
            if cap.fits(job, slot.node, indices) and ledger.check(job) is None:
                cap.take(job, slot.node, indices)
                ledger.take(job)
                places.append(Place(job.id, slot.node, indices, "ilp"))
            else:
                lost.append(job.id)
        if lost:
            notes.append(f"ilp: {len(lost)} solver choices did not map onto free GPUs: {lost}")
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
    ) -> Plan:
        places, cap, ledger = greedy_plan
        notes = [f"ilp: fell back to greedy: {why}"] if why else []
        notes += _outside_notes(snapshot, cap)
        return finish_plan(self.name, snapshot, cap, ledger, places, order, notes)
