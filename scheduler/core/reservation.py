"""Where and when a job that does not fit now could start, from the ends of the jobs in
the way: the shadow time of EASY backfill.

Ends come from running jobs (time limit, or prediction when the policy says so) and from
jobs placed earlier in the same cycle. With time limits the answer is a promise the
fleet can keep, since a job is stopped at its limit; with predictions it is a guess.

A multi-node gang (and a one-node job asking for host CPUs or memory on a fleet that
reports them) is swept with `earliest_start_members`: GPU and host releases in time order,
until enough distinct nodes each hold a member.
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from scheduler.core._capacity_index import host_request, node_count, per_node_gpus
from scheduler.core.model import FULL_COMPUTE, Member, RunningJob
from scheduler.core.placement import FreeCapacity, Members, spread


@dataclass(frozen=True, slots=True)
class Occupant:
    """Something holding GPU capacity until `end`: a running job or a fresh placement."""

    end: float
    node: str
    gpu_indices: tuple[int, ...]
    gpus: int
    gpu_memory_mb: int | None = None
    gpu_compute_percent: int | None = None
    # Host CPUs and memory it holds on the node.
    cpus: int = 0
    memory_mb: int = 0


def occupant_of(job: Any, node: str, gpu_indices: tuple[int, ...], end: float) -> Occupant:
    return Occupant(
        end,
        node,
        gpu_indices,
        job.gpus,
        job.gpu_memory_mb,
        job.gpu_compute_percent,
        job.cpus,
        job.memory_mb,
    )


def occupants_of(job: Any, members: Members, end: float) -> list[Occupant]:
    """One occupant per member of a placement."""
    return [occupant_of(job, m.node, m.gpu_indices, end) for m in members]


# Occupant of each running job seen lately, by (id of the frozen RunningJob, predictions):
# drivers that keep RunningJob objects across cycles (the simulator) reuse them.
_OCCUPANTS: dict[tuple[int, bool], tuple[RunningJob, list[Occupant]]] = {}
_OCCUPANTS_MAX = 1 << 16


def running_occupants(running: tuple[RunningJob, ...], *, use_predictions: bool) -> list[Occupant]:
    if len(_OCCUPANTS) >= _OCCUPANTS_MAX:
        _OCCUPANTS.clear()
    out: list[Occupant] = []
    for r in running:
        key = (id(r), use_predictions)
        hit = _OCCUPANTS.get(key)
        if hit is None or hit[0] is not r:
            end = r.expected_end if use_predictions else r.limit_end
            hit = _OCCUPANTS[key] = (r, occupants_of(r, r.allocations, end))
        out.extend(hit[1])
    return out


class ReleaseTimeline:
    """When each busy GPU of the running jobs is given back, kept across cycles.

    Per GPU: the last end of its occupants, how many whole-GPU jobs hold it and what its
    fractions give back; and every GPU's (end, node, index) in one sorted list. `sync`
    brings it up to a new snapshot's running jobs by identity: a driver that carries its
    (frozen) RunningJob objects over (the simulator) pays for the jobs that started or
    ended, one that builds new objects every cycle (production) rebuilds it. A job is
    never trusted by id alone: an entry counts only while it is the very same object.
    """

    def __init__(self, use_predictions: bool) -> None:
        self.use_predictions = use_predictions
        self._jobs: dict[int, RunningJob] = {}
        # Per GPU: [last end, whole-GPU holders, fraction memory, fraction compute, ends].
        self._gpus: dict[tuple[str, int], list[Any]] = {}
        self._sorted: list[tuple[float, str, int]] = []
        self._built = False  # whether _gpus and _sorted hold the jobs of _jobs
        self.rebuilds = 0  # syncs that found none of the jobs of the last (tests, benches)

    def sync(self, running: tuple[RunningJob, ...]) -> bool:
        """Bring the timeline up to these running jobs; False when the caller should sweep
        them the plain way: when none of the jobs of the last call is left (a driver that
        builds new objects every cycle would pay for a rebuild every cycle) or one object
        is listed twice. Built on the first call that finds jobs of the last one."""
        now_jobs = dict(zip(map(id, running), running, strict=True))
        jobs = self._jobs
        if len(now_jobs) != len(running):
            self._jobs, self._gpus, self._sorted, self._built = {}, {}, [], False
            return False
        # (The objects of the last call are held, so a shared id is a shared object.)
        if now_jobs.keys().isdisjoint(jobs):
            if self._built or jobs:
                self.rebuilds += 1
            self._jobs, self._gpus, self._sorted, self._built = now_jobs, {}, [], False
            return not running
        touched: dict[tuple[str, int], tuple[float, str, int] | None] = {}
        if not self._built:
            jobs = {}
            self._built = True
        for k in jobs.keys() - now_jobs.keys():
            self._apply(jobs[k], -1, touched)
        for k in now_jobs.keys() - jobs.keys():
            self._apply(now_jobs[k], 1, touched)
        self._jobs = now_jobs
        self._resort(touched)
        return True

    def _apply(self, r: RunningJob, sign: int, touched: dict[tuple[str, int], Any]) -> None:
        end = r.expected_end if self.use_predictions else r.limit_end
        gpus = self._gpus
        for member in r.allocations:
            for idx in member.gpu_indices:
                where = (member.node, idx)
                entry = gpus.get(where)
                if where not in touched:
                    touched[where] = None if entry is None else (entry[0], where[0], idx)
                if entry is None:
                    entry = gpus[where] = [-math.inf, 0, 0, 0, []]
                ends: list[float] = entry[4]
                if sign > 0:
                    ends.append(end)
                    if end > entry[0]:
                        entry[0] = end
                else:
                    ends.remove(end)
                    entry[0] = max(ends, default=-math.inf)
                if r.gpus:
                    entry[1] += sign
                else:
                    entry[2] += sign * (r.gpu_memory_mb or 0)
                    entry[3] += sign * (r.gpu_compute_percent or 0)
                if not ends:
                    del gpus[where]

    def _resort(self, touched: dict[tuple[str, int], tuple[float, str, int] | None]) -> None:
        ordered = self._sorted
        if len(touched) * 8 > len(ordered):
            self._sorted = sorted((e[0], n, i) for (n, i), e in self._gpus.items())
            return
        for where, old in touched.items():
            if old is not None:
                del ordered[bisect_left(ordered, old)]
            entry = self._gpus.get(where)
            if entry is not None:
                insort(ordered, (entry[0], where[0], where[1]))

    @staticmethod
    def handles(job: Any, cap: FreeCapacity) -> bool:
        """Whether `earliest_start` answers for this job (else use the plain function)."""
        return bool(job.gpus) and node_count(job) == 1 and not _host_bound(job, cap)

    def earliest_start(
        self, job: Any, cap: FreeCapacity, placed: list[Occupant], now: float
    ) -> tuple[str, float, tuple[int, ...]] | None:
        """What `earliest_start(job, cap, running occupants + placed, now)` gives, for a
        one-node job of whole GPUs that host CPUs and memory do not bind (`handles`);
        looks only at the releases until the job fits."""
        eligible = kind_eligibility(job, cap)

        ready: dict[tuple[str, str, int], list[int]] = {}
        filled: set[str] = set()
        need = job.gpus

        def fill(node: str) -> list[int]:
            """Put the node's wholly free eligible GPUs in `ready`; the first of its lists
            (in GPU order) that holds the job, or []."""
            filled.add(node)
            free_now = cap.whole_free(node) if cap.is_schedulable(node) else ()
            lists: list[list[int]] = []
            for gpu in cap.node_gpus(node) if free_now else ():
                if gpu.index in free_now and eligible(node, gpu):
                    indices = ready.setdefault((node, gpu.model, gpu.memory_mb), [])
                    if not indices:
                        lists.append(indices)
                    indices.append(gpu.index)
            return next((x for x in lists if len(x) >= need), [])

        # Free now: only a node with that many wholly free GPUs of one kind can hold the
        # job at once (the others are filled when a release reaches them).
        for node in cap.nodes_with_whole_free(need):
            indices = fill(node)
            if indices:
                return node, now, tuple(indices[:need])
        # GPUs the jobs placed in this cycle touch: their totals with those jobs added.
        extra: dict[tuple[str, int], list[Any]] = {}
        for occ in placed:
            for idx in occ.gpu_indices:
                where = (occ.node, idx)
                entry = extra.get(where)
                if entry is None:
                    base = self._gpus.get(where)
                    entry = extra[where] = [-math.inf, 0, 0, 0] if base is None else base[:4]
                if occ.end > entry[0]:
                    entry[0] = occ.end
                if occ.gpus:
                    entry[1] += 1
                else:
                    entry[2] += occ.gpu_memory_mb or 0
                    entry[3] += occ.gpu_compute_percent or 0
        gpus = self._gpus
        gpus_of: dict[str, dict[int, Any]] = {}
        for when, node, idx in self._releases(extra, now):
            where = (node, idx)
            totals = extra.get(where) or gpus[where]
            by_index = gpus_of.get(node)
            if by_index is None:
                by_index = gpus_of[node] = cap.gpus_by_index(node)
            held = by_index.get(idx)
            if held is None or not eligible(node, held):
                continue
            if not totals[1]:
                mem, comp = cap.free_on(node, idx)
                if not (comp + totals[3] >= FULL_COMPUTE and mem + totals[2] >= held.memory_mb):
                    continue
            if node not in filled:
                fill(node)
            indices = ready.setdefault((node, held.model, held.memory_mb), [])
            indices.append(idx)
            if len(indices) >= need:
                return node, when, tuple(sorted(indices[:need]))
        return None

    def _releases(
        self, extra: dict[tuple[str, int], list[Any]], now: float
    ) -> Iterator[tuple[float, str, int]]:
        """(max(now, end), node, index) of every busy GPU in order, as `_gang_sweep` sorts
        them: the sorted running list with the GPUs of this cycle's placements replaced."""
        ordered = self._sorted
        changed = sorted((e[0], n, i) for (n, i), e in extra.items())
        cut = bisect_left(ordered, (now,))
        overdue = [(now, n, i) for _, n, i in ordered[:cut] if (n, i) not in extra]
        overdue += [(now, n, i) for e, n, i in changed if e < now]
        overdue.sort()
        later = (t for t in itertools.islice(ordered, cut, None) if (t[1], t[2]) not in extra)
        yield from heapq.merge(overdue, later, (t for t in changed if t[0] >= now))


_TIMELINES: dict[bool, ReleaseTimeline] = {}


def earliest_start_running(
    job: Any,
    cap: FreeCapacity,
    running: tuple[RunningJob, ...],
    placed: list[Occupant],
    now: float,
    *,
    use_predictions: bool,
    incremental: bool = True,
) -> tuple[str, float, tuple[int, ...]] | None:
    """`earliest_start` over the running jobs' occupants and this cycle's placements; with
    `incremental`, through the release timeline carried across cycles where it answers."""
    if incremental and ReleaseTimeline.handles(job, cap):
        timeline = _TIMELINES.get(use_predictions)
        if timeline is None:
            timeline = _TIMELINES[use_predictions] = ReleaseTimeline(use_predictions)
        if timeline.sync(running):
            return timeline.earliest_start(job, cap, placed, now)
    occupants = running_occupants(running, use_predictions=use_predictions)
    return earliest_start(job, cap, occupants + placed, now)


def earliest_start(
    job: Any, cap: FreeCapacity, occupants: list[Occupant], now: float
) -> tuple[str, float, tuple[int, ...]] | None:
    """(node, start, gpu indices) where the job could start soonest, or None if never.

    A GPU counts as free for a gang once every occupant on it has ended; a fraction needs
    enough memory and compute left, releasing occupants in the order they end. For a
    multi-node gang use `earliest_start_members`.
    """
    if job.gpus and (node_count(job) > 1 or _host_bound(job, cap)):
        spread_found = earliest_start_members(job, cap, occupants, now)
        if spread_found is None:
            return None
        start, members = spread_found
        return members[0].node, start, members[0].gpu_indices
    if job.gpus:
        return _gang_sweep(job, cap, occupants, now)
    on_gpu: dict[tuple[str, int], list[Occupant]] = {}
    for occ in occupants:
        for idx in occ.gpu_indices:
            on_gpu.setdefault((occ.node, idx), []).append(occ)
    best: tuple[str, float, tuple[int, ...]] | None = None
    for node in cap.node_names():
        if not cap.is_schedulable(node):
            continue
        found = _fraction_on_node(job, cap, node, on_gpu, now)
        if found is not None and (best is None or found[0] < best[1]):
            best = (node, found[0], found[1])
    return best


def kind_eligibility(job: Any, cap: FreeCapacity) -> Callable[[str, Any], bool]:
    """Whether a GPU's model and memory suit the job, asked of `cap` once per kind (model,
    memory)."""
    kind_ok: dict[tuple[str, int], bool] = {}

    def eligible(node: str, gpu: Any) -> bool:
        key = (gpu.model, gpu.memory_mb)
        ok = kind_ok.get(key)
        if ok is None:
            ok = kind_ok[key] = cap.eligible(job, node, gpu)
        return ok

    return eligible


def _gang_sweep(
    job: Any, cap: FreeCapacity, occupants: list[Occupant], now: float
) -> tuple[str, float, tuple[int, ...]] | None:
    """Walk GPU release times in order, counting wholly free GPUs per node and kind, until
    some node holds the gang: O(busy GPUs log busy GPUs), not a pass per node."""
    eligible = kind_eligibility(job, cap)

    ready: dict[tuple[str, str, int], list[int]] = {}
    for node in cap.node_names():
        free_now = cap.whole_free(node) if cap.is_schedulable(node) else ()
        if not free_now:
            continue
        for gpu in cap.node_gpus(node):
            if gpu.index in free_now and eligible(node, gpu):
                ready.setdefault((node, gpu.model, gpu.memory_mb), []).append(gpu.index)
    for key, indices in ready.items():
        if len(indices) >= job.gpus:
            return key[0], now, tuple(indices[: job.gpus])
    # Per busy GPU: when its last occupant ends, whether a gang holds it (then it is wholly
    # free at that end), else what its fractions give back on top of what is free now.
    last: dict[tuple[str, int], float] = {}
    gang: set[tuple[str, int]] = set()
    back: dict[tuple[str, int], list[int]] = {}
    for occ in occupants:
        end, node, whole = occ.end, occ.node, occ.gpus
        for idx in occ.gpu_indices:
            where = (node, idx)
            seen = last.get(where)
            if seen is None or end > seen:
                last[where] = end
            if whole:
                gang.add(where)
            else:
                amounts = back.get(where)
                if amounts is None:
                    back[where] = [occ.gpu_memory_mb or 0, occ.gpu_compute_percent or 0]
                else:
                    amounts[0] += occ.gpu_memory_mb or 0
                    amounts[1] += occ.gpu_compute_percent or 0
    releases = []
    gpus_of: dict[str, dict[int, Any]] = {}
    for where, end in last.items():
        node, idx = where
        gpus = gpus_of.get(node)
        if gpus is None:
            gpus = gpus_of[node] = cap.gpus_by_index(node)
        held = gpus.get(idx)
        if held is None:
            continue
        if not eligible(node, held):
            continue
        if where not in gang:
            mem, comp = cap.free_on(node, idx)
            add_mem, add_comp = back[where]
            if not (comp + add_comp >= FULL_COMPUTE and mem + add_mem >= held.memory_mb):
                continue
        releases.append((max(now, end), node, idx, held.model, held.memory_mb))
    releases.sort()
    for when, node, idx, model, memory_mb in releases:
        indices = ready.setdefault((node, model, memory_mb), [])
        indices.append(idx)
        if len(indices) >= job.gpus:
            return node, when, tuple(sorted(indices[: job.gpus]))
    return None


def _fraction_on_node(
    job: Any, cap: FreeCapacity, node: str, on_gpu: dict, now: float
) -> tuple[float, tuple[int, ...]] | None:
    need_mem, need_comp = max(job.gpu_memory_mb or 0, 1), max(job.gpu_compute_percent or 0, 1)
    best: tuple[float, tuple[int, ...]] | None = None
    for gpu in cap.node_gpus(node):
        if not cap.eligible(job, node, gpu):
            continue
        mem, comp = cap.free_on(node, gpu.index)
        when = now if (mem >= need_mem and comp >= need_comp) else math.inf
        if when == math.inf:
            for occ in sorted(on_gpu.get((node, gpu.index), ()), key=lambda o: o.end):
                add_mem, add_comp = _amount(occ, gpu.memory_mb)
                mem, comp = mem + add_mem, comp + add_comp
                if mem >= need_mem and comp >= need_comp:
                    when = max(now, occ.end)
                    break
        if when < math.inf and (best is None or when < best[0]):
            best = (when, (gpu.index,))
    return best


def _amount(occ: Occupant, memory_mb: int) -> tuple[int, int]:
    if occ.gpus:
        return memory_mb, FULL_COMPUTE
    return occ.gpu_memory_mb or 0, occ.gpu_compute_percent or 0


def _host_bound(job: Any, cap: FreeCapacity) -> bool:
    cpus, memory_mb = host_request(job)
    return bool(cpus or memory_mb) and cap.host_limited()


def earliest_start_members(
    job: Any, cap: FreeCapacity, occupants: list[Occupant], now: float
) -> tuple[float, Members] | None:
    """(start, members) where a job of whole GPUs could start soonest on distinct nodes,
    each holding `gpus_per_node` GPUs of one kind and the host share it asks for, or None.

    Walks GPU and host releases in time order; a node holds a member once it has enough
    wholly free GPUs of a kind the job may use and enough free CPUs and memory. Members
    are picked as best_fit_members picks them (fewest groups, then tightest nodes).
    """
    need, per = node_count(job), per_node_gpus(job)
    cpus, ram = host_request(job)
    same_group = bool(getattr(job, "same_group", False))
    eligible = kind_eligibility(job, cap)

    # Free now: wholly free eligible GPUs per (node, kind), host per node.
    free: dict[tuple[str, tuple[str, int]], list[int]] = {}
    host: dict[str, list[float]] = {}
    for node in cap.node_names():
        if not cap.is_schedulable(node):
            continue
        c, m = cap.host_free(node)
        host[node] = [math.inf if c is None else c, math.inf if m is None else m]
        whole = set(cap.whole_free(node))
        for gpu in cap.node_gpus(node):
            if gpu.index in whole and eligible(node, gpu):
                free.setdefault((node, (gpu.model, gpu.memory_mb)), []).append(gpu.index)
    # Per busy eligible GPU: when it is wholly free again; per node: host given back.
    last: dict[tuple[str, int], float] = {}
    gang: set[tuple[str, int]] = set()
    back: dict[tuple[str, int], list[int]] = {}
    events: list[tuple[float, int, str, Any]] = []
    for occ in occupants:
        if occ.node not in host:
            continue
        if occ.cpus or occ.memory_mb:
            events.append((max(now, occ.end), 1, occ.node, (occ.cpus, occ.memory_mb)))
        for idx in occ.gpu_indices:
            where = (occ.node, idx)
            if occ.end > last.get(where, -math.inf):
                last[where] = occ.end
            if occ.gpus:
                gang.add(where)
            else:
                amounts = back.setdefault(where, [0, 0])
                amounts[0] += occ.gpu_memory_mb or 0
                amounts[1] += occ.gpu_compute_percent or 0
    for (node, idx), end in last.items():
        held = cap.gpus_by_index(node).get(idx)
        if held is None or not eligible(node, held):
            continue
        if (node, idx) not in gang:
            mem, comp = cap.free_on(node, idx)
            add_mem, add_comp = back[(node, idx)]
            if not (comp + add_comp >= FULL_COMPUTE and mem + add_mem >= held.memory_mb):
                continue
        events.append((max(now, end), 0, node, (idx, (held.model, held.memory_mb))))
    events.sort(key=lambda e: (e[0], e[1], e[2]))

    def host_ok(node: str) -> bool:
        c, m = host[node]
        return c >= cpus and m >= ram

    # Per kind, the nodes holding a member now; kept up to date for the nodes an event
    # touches, so each step costs what changed, not a pass over the fleet.
    kinds_of: dict[str, list[tuple[str, int]]] = {}
    for node, kind in free:
        kinds_of.setdefault(node, []).append(kind)
    ready: dict[tuple[str, int], set[str]] = {}

    def refresh(node: str) -> None:
        ok = host_ok(node)
        for kind in kinds_of.get(node, ()):
            nodes = ready.setdefault(kind, set())
            if ok and len(free[(node, kind)]) >= per:
                nodes.add(node)
            else:
                nodes.discard(node)

    for node in kinds_of:
        refresh(node)

    def attempt() -> Members | None:
        best: tuple[tuple[int, int], tuple[str, int], list[tuple[int, int]]] | None = None
        names: dict[int, str] = {}
        by_kind: dict[tuple[str, int], dict[str, list[tuple[int, int]]]] = {}
        for kind, nodes in ready.items():
            if len(nodes) < need:
                continue
            for node in sorted(nodes):
                pos = len(names)
                names[pos] = node
                groups = by_kind.setdefault(kind, {})
                groups.setdefault(cap.group_of(node), []).append((len(free[(node, kind)]), pos))
        for kind, by_group in by_kind.items():
            for cands in by_group.values():
                cands.sort()
            picked = spread(by_group, need, same_group)
            if picked is None:
                continue
            key = (picked[0], sum(c for c, _ in picked[1]))
            if best is None or key < best[0]:
                best = (key, kind, picked[1])
        if best is None:
            return None
        _, kind, chosen = best
        return tuple(
            Member(names[pos], tuple(sorted(free[(names[pos], kind)])[:per])) for _, pos in chosen
        )

    found = attempt()
    if found is not None:
        return now, found
    i = 0
    while i < len(events):
        when = events[i][0]
        touched = set()
        while i < len(events) and events[i][0] <= when:
            _, what, node, detail = events[i]
            if what == 0:
                idx, kind = detail
                indices = free.setdefault((node, kind), [])
                if not indices and kind not in kinds_of.setdefault(node, []):
                    kinds_of[node].append(kind)
                indices.append(idx)
            else:
                host[node][0] += detail[0]
                host[node][1] += detail[1]
            touched.add(node)
            i += 1
        for node in touched:
            refresh(node)
        if not any(len(nodes) >= need for nodes in ready.values()):
            continue
        found = attempt()
        if found is not None:
            return when, found
    return None
