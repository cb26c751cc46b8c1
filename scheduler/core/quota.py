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

from scheduler.core.model import RunningJob, Snapshot, TeamState
from scheduler.core.running_totals import RunningTotals, host_share

_EPS = 1e-9


def _fmt(value: float) -> str:
    return f"{value:g}" if value != int(value) else str(int(value))


class QuotaLedger:
    """Usage per team and per (team, user), updated as a policy places or ends jobs.

    A ledger from a snapshot counts its running jobs when first read: many cycles place
    jobs without any quota, guarantee or cap to check them against, and never read it
    (before that, `take` and `release` are kept in order and applied after the count)."""

    def __init__(self, teams: Mapping[str, TeamState], running: Iterable[RunningJob]) -> None:
        self.teams = teams
        self._team: dict[str, float] = {}
        self._user: dict[tuple[str, str], float] = {}
        self._cpu: dict[str, int] = {}
        self._memory: dict[str, int] = {}
        # Until the first read: the snapshot whose running jobs are to be counted (with
        # the totals kept across cycles where `_carried`), and the moves made since.
        self._source: Snapshot | None = None
        self._carried = False
        self._moves: list[tuple[bool, Any]] = []
        for job in running:
            self._take(job)

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, *, carried: bool = False) -> QuotaLedger:
        """The ledger of the snapshot's running jobs, counted when first read; with
        `carried`, from the totals kept since the last count, updated by job object (the
        same numbers: see RunningTotals)."""
        ledger = cls(snapshot.teams, ())
        ledger._source, ledger._carried = snapshot, carried
        return ledger

    def _counted(self) -> QuotaLedger:
        """The ledger, its running jobs counted (and the moves made before applied)."""
        snapshot = self._source
        if snapshot is None:
            return self
        self._source = None
        totals = None
        if self._carried:
            totals = _RUNNING.sync(snapshot.running, snapshot.running_changes)
        if totals is not None:
            self._team, self._user, self._cpu, self._memory = totals
        else:
            for job in snapshot.running:
                self._take(job)
        moves, self._moves = self._moves, []
        for taken, job in moves:
            (self._take if taken else self._release)(job)
        return self

    @property
    def team_usage(self) -> dict[str, float]:
        return self._counted()._team

    @property
    def user_usage(self) -> dict[tuple[str, str], float]:
        return self._counted()._user

    @property
    def cpu_usage(self) -> dict[str, int]:
        return self._counted()._cpu

    @property
    def memory_usage(self) -> dict[str, int]:
        return self._counted()._memory

    def team(self, slug: str) -> TeamState:
        state = self.teams.get(slug)
        return state if state is not None else TeamState(slug=slug)

    def usage(self, team: str) -> float:
        return self.team_usage.get(team, 0.0)

    def user(self, team: str, user: str) -> float:
        return self.user_usage.get((team, user), 0.0)

    def take(self, job: Any) -> None:
        if self._source is not None:
            self._moves.append((True, job))
        else:
            self._take(job)

    def release(self, job: Any) -> None:
        if self._source is not None:
            self._moves.append((False, job))
        else:
            self._release(job)

    def _take(self, job: Any) -> None:
        amount = job.gpu_equivalent
        team = job.team
        usage = self._team
        usage[team] = usage.get(team, 0.0) + amount
        key = (team, job.user)
        usage_of = self._user
        usage_of[key] = usage_of.get(key, 0.0) + amount
        cpus, memory = host_share(job)
        if cpus:
            self._cpu[team] = self._cpu.get(team, 0) + cpus
        if memory:
            self._memory[team] = self._memory.get(team, 0) + memory

    def _release(self, job: Any) -> None:
        amount = job.gpu_equivalent
        team = job.team
        self._team[team] = max(0.0, self._team.get(team, 0.0) - amount)
        key = (team, job.user)
        self._user[key] = max(0.0, self._user.get(key, 0.0) - amount)
        cpus, memory = host_share(job)
        if cpus:
            self._cpu[team] = max(0, self._cpu.get(team, 0) - cpus)
        if memory:
            self._memory[team] = max(0, self._memory.get(team, 0) - memory)

    def cpus(self, team: str) -> int:
        """Host CPU cores the team's running and placed jobs hold, over all their nodes."""
        return self.cpu_usage.get(team, 0)

    def memory_mb(self, team: str) -> int:
        """Host memory (MB) the team's running and placed jobs hold, over all their nodes."""
        return self.memory_usage.get(team, 0)

    def check(self, job: Any) -> str | None:
        """Why the job may not start under its team's hard limit or user cap, or None."""
        slug = job.team
        team = self.teams.get(slug)
        if team is None:
            return None
        need = job.gpu_equivalent
        limit = team.hard_limit_gpus
        if limit is not None:
            used = self.team_usage.get(slug, 0.0)
            if used + need > limit + _EPS:
                return (
                    f"team {job.team} uses {_fmt(used)} of its hard limit of "
                    f"{team.hard_limit_gpus} GPUs; this job needs {_fmt(need)}"
                )
        cap = team.user_gpu_cap
        if cap is not None:
            used = self.user_usage.get((slug, job.user), 0.0)
            if used + need > cap + _EPS:
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
        limit = self.team(job.team).guaranteed_gpus + _EPS
        need = job.gpu_equivalent
        # Usage is never negative, so a job larger than the guarantee answers alone (and a
        # ledger not read yet stays uncounted: a team without a guarantee is the common case).
        return need <= limit and self.usage(job.team) + need <= limit

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


_RUNNING = RunningTotals()
