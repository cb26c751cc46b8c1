"""The release timeline: when each busy GPU is given back, kept across cycles, and the
reservation search for a one-node whole-GPU job that walks it."""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left, insort
from collections.abc import Iterator
from typing import Any

from scheduler.core._capacity_index import node_count
from scheduler.core.model import FULL_COMPUTE, RunningChanges, RunningJob
from scheduler.core.placement import FreeCapacity
from scheduler.core.reservation.members import host_bound, kind_eligibility
from scheduler.core.reservation.occupants import Occupant, placements, running_occupants
from scheduler.core.reservation.sweep import earliest_start


class ReleaseTimeline:
    """When each busy GPU of the running jobs is given back, kept across cycles.

    Per GPU: the last end of its occupants, how many whole-GPU jobs hold it and what its
    fractions give back; and every GPU's (end, node, index) in one sorted list. `sync`
    brings it up to a new snapshot's running jobs by identity: a driver that carries its
    (frozen) RunningJob objects over (the simulator) pays for the jobs that started or
    ended, one that builds new objects every cycle (production) rebuilds it. A job is
    never trusted by id alone: an entry counts only while it is the very same object.
    Where the snapshot says which jobs started and stopped since the running jobs of the
    last call (`Snapshot.running_changes`), only those are looked at.
    """

    def __init__(self, use_predictions: bool) -> None:
        self.use_predictions = use_predictions
        self._jobs: dict[int, RunningJob] = {}
        # Per GPU: [last end, whole-GPU holders, fraction memory, fraction compute, ends].
        self._gpus: dict[tuple[str, int], list[Any]] = {}
        self._sorted: list[tuple[float, str, int]] = []
        # The (node, index) of the GPUs in _sorted whose end is before _due_now, in that
        # order: the GPUs overdue at a search's `now` all come back at `now`, so in node
        # and index order; kept as `now` moves and GPUs change (see _overdue).
        self._due: list[tuple[str, int]] = []
        self._due_now = -math.inf
        self._built = False  # whether _gpus and _sorted hold the jobs of _jobs
        self.rebuilds = 0  # syncs that found none of the jobs of the last (tests, benches)
        self.changes_used = 0  # syncs answered from the snapshot's running_changes
        # The running jobs last synced to (held, so its identity stays its own).
        self._synced: tuple[RunningJob, ...] | None = None

    def sync(self, running: tuple[RunningJob, ...], changes: RunningChanges | None = None) -> bool:
        """Bring the timeline up to these running jobs; False when the caller should sweep
        them the plain way: when none of the jobs of the last call is left (a driver that
        builds new objects every cycle would pay for a rebuild every cycle) or one object
        is listed twice. Built on the first call that finds jobs of the last one."""
        synced, self._synced = self._synced, None
        if running is synced:
            self._synced = running
            return True
        if changes is not None and synced is not None and changes.before is synced:
            if self._apply_changes(running, changes):
                self.changes_used += 1
                self._synced = running
                return True
        now_jobs = dict(zip(map(id, running), running, strict=True))
        jobs = self._jobs
        if len(now_jobs) != len(running):
            self._jobs, self._gpus, self._built = {}, {}, False
            self._set_sorted([])
            return False
        # (The objects of the last call are held, so a shared id is a shared object.)
        if now_jobs.keys().isdisjoint(jobs):
            if self._built or jobs:
                self.rebuilds += 1
            self._jobs, self._gpus, self._built = now_jobs, {}, False
            self._set_sorted([])
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
        self._synced = running
        return True

    def _apply_changes(self, running: tuple[RunningJob, ...], changes: RunningChanges) -> bool:
        """Take off the jobs that stopped and add those that started, when the changes are
        consistent with the jobs held and the new list (else nothing is touched)."""
        jobs = self._jobs
        keys = changes.keys_against(jobs, running) if self._built else None
        if keys is None:
            return False
        gone, new = keys
        removed, added = changes.removed, changes.added
        touched: dict[tuple[str, int], tuple[float, str, int] | None] = {}
        for k, r in zip(gone, removed, strict=True):
            del jobs[k]
            self._apply(r, -1, touched)
        for k, r in zip(new, added, strict=True):
            jobs[k] = r
            self._apply(r, 1, touched)
        self._resort(touched)
        return True

    def _apply(self, r: RunningJob, sign: int, touched: dict[tuple[str, int], Any]) -> None:
        end = r.expected_end if self.use_predictions else r.limit_end
        whole = r.gpus
        memory = sign * (r.gpu_memory_mb or 0)
        compute = sign * (r.gpu_compute_percent or 0)
        gpus = self._gpus
        for node, indices in placements(r):
            for idx in indices:
                where = (node, idx)
                entry = gpus.get(where)
                if where not in touched:
                    touched[where] = None if entry is None else (entry[0], node, idx)
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
                if whole:
                    entry[1] += sign
                else:
                    entry[2] += memory
                    entry[3] += compute
                if not ends:
                    del gpus[where]

    def _resort(self, touched: dict[tuple[str, int], tuple[float, str, int] | None]) -> None:
        ordered = self._sorted
        if len(touched) * 8 > len(ordered):
            self._set_sorted(sorted((e[0], n, i) for (n, i), e in self._gpus.items()))
            return
        due, due_now = self._due, self._due_now
        kept = True
        for where, old in touched.items():
            if old is not None:
                del ordered[bisect_left(ordered, old)]
                if old[0] < due_now:
                    kept = _drop(due, where) and kept
            entry = self._gpus.get(where)
            if entry is not None:
                insort(ordered, (entry[0], where[0], where[1]))
                if entry[0] < due_now:
                    insort(due, where)
        if not kept:  # (never, while the list is what it says: then made afresh)
            self._due, self._due_now = [], -math.inf

    def _set_sorted(self, ordered: list[tuple[float, str, int]]) -> None:
        self._sorted, self._due, self._due_now = ordered, [], -math.inf

    def _overdue(self, now: float) -> list[tuple[str, int]]:
        """(node, index) of the GPUs whose end is before `now`, in that order; brought from
        the last `now` asked by the GPUs whose end lies between (or sorted afresh when they
        are many)."""
        due, was = self._due, self._due_now
        if now == was:
            return due
        ordered = self._sorted
        lo = bisect_left(ordered, (min(now, was),))
        hi = bisect_left(ordered, (max(now, was),))
        if now > was and (hi - lo) * 4 <= len(due) + 64:
            for _, n, i in itertools.islice(ordered, lo, hi):
                insort(due, (n, i))
        elif (hi - lo) * 4 > len(due) + 64 or not all(
            _drop(due, (n, i)) for _, n, i in itertools.islice(ordered, lo, hi)
        ):
            due = self._due = sorted((n, i) for _, n, i in ordered[: bisect_left(ordered, (now,))])
        self._due_now = now
        return due

    @staticmethod
    def handles(job: Any, cap: FreeCapacity) -> bool:
        """Whether `earliest_start` answers for this job (else use the plain function)."""
        return bool(job.gpus) and node_count(job) == 1 and not host_bound(job, cap)

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
        # Nodes with some wholly free GPU: the only ones `fill` adds anything for.
        some_free = set(cap.nodes_with_whole_free(1))
        usable: dict[tuple[str, str, int], bool] = {}  # by (node, model, memory): eligible
        for when, node, idx in self._releases(extra, now):
            by_index = gpus_of.get(node)
            if by_index is None:
                by_index = gpus_of[node] = cap.gpus_by_index(node)
            held = by_index.get(idx)
            if held is None:
                continue
            kind = (node, held.model, held.memory_mb)
            ok = usable.get(kind)
            if ok is None:
                ok = usable[kind] = eligible(node, held)
            if not ok:
                continue
            totals = extra.get((node, idx)) if extra else None
            if totals is None:
                totals = gpus[node, idx]
            if not totals[1]:
                mem, comp = cap.free_on(node, idx)
                if not (comp + totals[3] >= FULL_COMPUTE and mem + totals[2] >= held.memory_mb):
                    continue
            if node not in filled:
                if node in some_free:
                    fill(node)
                else:
                    filled.add(node)
            listed = ready.get(kind)
            if listed is None:
                listed = ready[kind] = []
            listed.append(idx)
            if len(listed) >= need:
                return node, when, tuple(sorted(listed[:need]))
        return None

    def _releases(
        self, extra: dict[tuple[str, int], list[Any]], now: float
    ) -> Iterator[tuple[float, str, int]]:
        """(max(now, end), node, index) of every busy GPU in order, as `_gang_sweep` sorts
        them: the sorted running list with the GPUs of this cycle's placements replaced.
        First what comes back at `now` (the overdue GPUs, kept in node order, and the few
        placed or ending exactly now), then the rest; each GPU appears once, so merging a
        few by hand into a sorted run gives the order a full sort would."""
        ordered = self._sorted
        cut = bisect_left(ordered, (now,))
        ties = cut
        while ties < len(ordered) and ordered[ties][0] == now:
            ties += 1
        due: Iterator[tuple[str, int]] = iter(self._overdue(now))
        later: Iterator[tuple[float, str, int]] = itertools.islice(ordered, ties, None)
        at_now = ordered[cut:ties]
        placed_later: list[tuple[float, str, int]] = []
        if extra:
            due = (w for w in due if w not in extra)
            later = (t for t in later if (t[1], t[2]) not in extra)
            at_now = [t for t in at_now if (t[1], t[2]) not in extra]
            for (n, i), e in extra.items():
                if e[0] <= now:
                    at_now.append((now, n, i))
                else:
                    placed_later.append((e[0], n, i))
            at_now.sort()
            placed_later.sort()
        yield from _merged(((now, n, i) for n, i in due), at_now)
        yield from _merged(later, placed_later)


def _drop(due: list[tuple[str, int]], where: tuple[str, int]) -> bool:
    """Take `where` off the sorted list; False when it is not there."""
    k = bisect_left(due, where)
    if k == len(due) or due[k] != where:
        return False
    del due[k]
    return True


def _merged(
    run: Iterator[tuple[float, str, int]], few: list[tuple[float, str, int]]
) -> Iterator[tuple[float, str, int]]:
    """A sorted run and a short sorted list (no item in both) merged in order."""
    if not few:
        yield from run
        return
    j, left = 0, len(few)
    head = few[0]
    for t in run:
        while head < t:
            yield head
            j += 1
            if j == left:
                yield t
                yield from run
                return
            head = few[j]
        yield t
    yield from few[j:]


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
    running_changes: RunningChanges | None = None,
) -> tuple[str, float, tuple[int, ...]] | None:
    """`earliest_start` over the running jobs' occupants and this cycle's placements; with
    `incremental`, through the release timeline carried across cycles where it answers
    (brought up to date from `running_changes`, the snapshot's, where given)."""
    if incremental and ReleaseTimeline.handles(job, cap):
        timeline = _TIMELINES.get(use_predictions)
        if timeline is None:
            timeline = _TIMELINES[use_predictions] = ReleaseTimeline(use_predictions)
        if timeline.sync(running, running_changes):
            return timeline.earliest_start(job, cap, placed, now)
    occupants = running_occupants(running, use_predictions=use_predictions)
    return earliest_start(job, cap, occupants + placed, now)
