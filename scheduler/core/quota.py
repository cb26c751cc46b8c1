"""Team and user GPU usage against quotas, counted in GPU equivalents.

A team is guaranteed `guaranteed_gpus` (what preemption wins back for it) and may borrow
idle capacity above that up to `hard_limit_gpus` (None: the whole fleet). Each user of a
team may hold at most `user_gpu_cap` (None: no cap). Fractions count by their compute
share, so four 25 % jobs weigh one GPU.

Teams may also have hard limits on host CPU cores (`hard_limit_cpus`) and memory
(`hard_limit_memory_mb`); a job holds its per-node `cpus` and `memory_mb` on each of its
nodes, so a gang of 4 nodes asking 16 CPUs holds 64.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from scheduler.core.model import RunningChanges, RunningJob, Snapshot, TeamState

_EPS = 1e-9


def host_share(job: Any) -> tuple[int, int]:
    """(CPU cores, memory MB) the job holds over all its nodes; (0, 0) cheaply when none."""
    cpus = getattr(job, "cpus", 0) or 0
    memory = getattr(job, "memory_mb", 0) or 0
    if not cpus and not memory:
        return 0, 0
    members = getattr(job, "members", None)
    nodes = 1 + len(members) if members is not None else job.nodes
    return cpus * nodes, memory * nodes


def _fmt(value: float) -> str:
    return f"{value:g}" if value != int(value) else str(int(value))


class QuotaLedger:
    """Usage per team and per (team, user), updated as a policy places or ends jobs."""

    def __init__(self, teams: Mapping[str, TeamState], running: Iterable[RunningJob]) -> None:
        self.teams = teams
        self.team_usage: dict[str, float] = {}
        self.user_usage: dict[tuple[str, str], float] = {}
        self.cpu_usage: dict[str, int] = {}
        self.memory_usage: dict[str, int] = {}
        for job in running:
            self.take(job)

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, *, carried: bool = False) -> QuotaLedger:
        """The ledger of the snapshot's running jobs; with `carried`, from the totals kept
        since the last call, updated by job object (the same numbers: see RunningTotals)."""
        if carried:
            totals = _RUNNING.sync(snapshot.running, snapshot.running_changes)
            if totals is not None:
                ledger = cls(snapshot.teams, ())
                ledger.team_usage, ledger.user_usage, ledger.cpu_usage, ledger.memory_usage = totals
                return ledger
        return cls(snapshot.teams, snapshot.running)

    def team(self, slug: str) -> TeamState:
        state = self.teams.get(slug)
        return state if state is not None else TeamState(slug=slug)

    def usage(self, team: str) -> float:
        return self.team_usage.get(team, 0.0)

    def user(self, team: str, user: str) -> float:
        return self.user_usage.get((team, user), 0.0)

    def take(self, job: Any) -> None:
        amount = job.gpu_equivalent
        self.team_usage[job.team] = self.team_usage.get(job.team, 0.0) + amount
        key = (job.team, job.user)
        self.user_usage[key] = self.user_usage.get(key, 0.0) + amount
        cpus, memory = host_share(job)
        if cpus:
            self.cpu_usage[job.team] = self.cpu_usage.get(job.team, 0) + cpus
        if memory:
            self.memory_usage[job.team] = self.memory_usage.get(job.team, 0) + memory

    def release(self, job: Any) -> None:
        amount = job.gpu_equivalent
        self.team_usage[job.team] = max(0.0, self.team_usage.get(job.team, 0.0) - amount)
        key = (job.team, job.user)
        self.user_usage[key] = max(0.0, self.user_usage.get(key, 0.0) - amount)
        cpus, memory = host_share(job)
        if cpus:
            self.cpu_usage[job.team] = max(0, self.cpu_usage.get(job.team, 0) - cpus)
        if memory:
            self.memory_usage[job.team] = max(0, self.memory_usage.get(job.team, 0) - memory)

    def cpus(self, team: str) -> int:
        """Host CPU cores the team's running and placed jobs hold, over all their nodes."""
        return self.cpu_usage.get(team, 0)

    def memory_mb(self, team: str) -> int:
        """Host memory (MB) the team's running and placed jobs hold, over all their nodes."""
        return self.memory_usage.get(team, 0)

    def check(self, job: Any) -> str | None:
        """Why the job may not start under its team's hard limit or user cap, or None."""
        team = self.teams.get(job.team)
        if team is None:
            return None
        need = job.gpu_equivalent
        if team.hard_limit_gpus is not None:
            used = self.usage(job.team)
            if used + need > team.hard_limit_gpus + _EPS:
                return (
                    f"team {job.team} uses {_fmt(used)} of its hard limit of "
                    f"{team.hard_limit_gpus} GPUs; this job needs {_fmt(need)}"
                )
        if team.user_gpu_cap is not None:
            used = self.user(job.team, job.user)
            if used + need > team.user_gpu_cap + _EPS:
                return (
                    f"user {job.user} uses {_fmt(used)} of the per-user cap of "
                    f"{team.user_gpu_cap} GPUs in team {job.team}; this job needs {_fmt(need)}"
                )
        if team.hard_limit_cpus is None and team.hard_limit_memory_mb is None:
            return None
        cpus, memory = host_share(job)
        if cpus and team.hard_limit_cpus is not None:
            total = self.cpus(job.team) + cpus
            if total > team.hard_limit_cpus:
                return (
                    f"team {job.team} would use {total} of its {team.hard_limit_cpus} CPUs; "
                    f"this job needs {cpus}"
                )
        if memory and team.hard_limit_memory_mb is not None:
            total = self.memory_mb(job.team) + memory
            if total > team.hard_limit_memory_mb:
                return (
                    f"team {job.team} would use {total} of its {team.hard_limit_memory_mb} MB "
                    f"of host memory; this job needs {memory} MB"
                )
        return None

    def within_guarantee(self, job: Any) -> bool:
        """Whether the job's team stays within its guaranteed GPUs with this job added."""
        team = self.team(job.team)
        return self.usage(job.team) + job.gpu_equivalent <= team.guaranteed_gpus + _EPS

    def borrowing(self, team: str) -> float:
        """GPU equivalents the team uses above its guarantee (0 when within it)."""
        return max(0.0, self.usage(team) - self.team(team).guaranteed_gpus)

    def describe(self, team: str) -> str:
        """'team vision uses 6 of its 8 guaranteed GPUs' (or its hard limit when it has none)."""
        state = self.team(team)
        used = _fmt(self.usage(team))
        if state.guaranteed_gpus:
            return f"team {team} uses {used} of its {state.guaranteed_gpus} guaranteed GPUs"
        if state.hard_limit_gpus is not None:
            return f"team {team} uses {used} of its hard limit of {state.hard_limit_gpus} GPUs"
        return f"team {team} uses {used} GPUs"


Totals = tuple[dict[str, float], dict[tuple[str, str], float], dict[str, int], dict[str, int]]


class RunningTotals:
    """What running jobs hold per team and per user, kept across cycles by job object.

    `sync` adds the jobs new since the last call and takes off those gone, then hands out
    copies (None where the ledger must be summed afresh). Where the snapshot says which
    jobs started and stopped since the running jobs of the last call
    (`Snapshot.running_changes`), only those are looked at; otherwise the lists are compared.
    A sum of floats depends on the order of its terms unless every term is a whole number:
    while some running job holds a fraction (compute share not a whole GPU), or
    one object is listed twice, it answers None and the ledger is summed afresh.
    """

    def __init__(self) -> None:
        self.rebuilds = 0  # syncs that kept no job (for tests and benches)
        self.changes_used = 0  # syncs answered from the snapshot's running_changes
        self._reset()

    def _reset(self) -> None:
        self._jobs: dict[int, Any] = {}
        self._ledger = QuotaLedger({}, ())
        self._count: dict[Any, int] = {}  # jobs per team and per (team, user)
        self._inexact = 0  # jobs whose GPU equivalent is not a whole number
        self._built = False  # whether the totals hold the jobs of _jobs
        # The running jobs the totals were last brought up to (held, so its identity stays
        # its own).
        self._synced: tuple[RunningJob, ...] | None = None

    def sync(
        self, running: tuple[RunningJob, ...], changes: RunningChanges | None = None
    ) -> Totals | None:
        synced, self._synced = self._synced, None
        if (
            changes is not None
            and synced is not None
            and changes.before is synced
            and self._apply(running, changes)
        ):
            self._synced = running
            self.changes_used += 1
            return self._totals()
        now = dict(zip(map(id, running), running, strict=True))
        jobs = self._jobs
        if len(now) != len(running):
            self._reset()
            return None
        # (The objects of the last call are held, so a shared id is a shared object.)
        if now.keys().isdisjoint(jobs):
            # None of the last call's jobs is left: a driver that builds new objects every
            # cycle (production) would pay for a rebuild every cycle, so the ledger sums
            # afresh; the totals are built on the first call that finds jobs of the last.
            if jobs:
                self.rebuilds += 1
            self._reset()
            self._jobs = now
            return None
        if not self._built:
            jobs = {}
            self._built = True
        for k in jobs.keys() - now.keys():
            self._add(jobs[k], -1)
        for k in now.keys() - jobs.keys():
            self._add(now[k], 1)
        self._jobs = now
        self._synced = running
        return self._totals()

    def _apply(self, running: tuple[RunningJob, ...], changes: RunningChanges) -> bool:
        """Take off the jobs that stopped and add those that started, when the changes are
        consistent with the jobs held and the new list (else nothing is touched)."""
        jobs = self._jobs
        keys = changes.keys_against(jobs, running) if self._built else None
        if keys is None:
            return False
        gone, new = keys
        added = changes.added
        for k in gone:
            self._add(jobs.pop(k), -1)
        for k, job in zip(new, added, strict=True):
            jobs[k] = job
            self._add(job, 1)
        return True

    def _totals(self) -> Totals | None:
        if self._inexact:
            return None
        ledger = self._ledger
        return (
            dict(ledger.team_usage),
            dict(ledger.user_usage),
            dict(ledger.cpu_usage),
            dict(ledger.memory_usage),
        )

    def _add(self, job: Any, sign: int) -> None:
        amount = job.gpu_equivalent
        if amount != int(amount):
            self._inexact += sign
        ledger = self._ledger
        if sign > 0:
            ledger.take(job)
        else:
            ledger.release(job)
        # As in a fresh ledger: no entry for a team or user with nothing running, nor for
        # host CPUs or memory a team no longer holds.
        user = (job.team, job.user)
        if self._counted(job.team, sign):
            ledger.team_usage.pop(job.team, None)
        if self._counted(user, sign):
            ledger.user_usage.pop(user, None)
        if sign < 0:
            if not ledger.cpu_usage.get(job.team, 1):
                del ledger.cpu_usage[job.team]
            if not ledger.memory_usage.get(job.team, 1):
                del ledger.memory_usage[job.team]

    def _counted(self, key: Any, sign: int) -> bool:
        """Count a job in or out under `key`; True when none is left."""
        left = self._count[key] = self._count.get(key, 0) + sign
        if left:
            return False
        del self._count[key]
        return True


_RUNNING = RunningTotals()
