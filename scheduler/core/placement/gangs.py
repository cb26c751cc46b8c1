"""Multi-node gangs in FreeCapacity: every member on its own node, all GPUs of one kind,
from as few topology groups as possible."""

from __future__ import annotations

from typing import Any

from scheduler.core._capacity_index import (
    Kind,
    _KindIndex,
    host_request,
    node_count,
    per_node_gpus,
)
from scheduler.core.model import (
    Member,
)
from scheduler.core.placement.search import OneNodeSearch
from scheduler.core.placement.state import Members


class GangSearch(OneNodeSearch):
    def best_fit_members(self, job: Any) -> Members | None:
        """Every member of the job's best placement, rank 0 first, or None when it does not
        fit now: one member for a one-node job (as `best_fit`); for a multi-node gang a
        distinct node per member, all of them or none."""
        if not (job.gpus_per_node and job.gpus > job.gpus_per_node):
            choice = self.best_fit(job)
            return None if choice is None else (Member(choice[0], choice[1]),)
        shape = self.shape(job)
        if shape in self._fails:
            return None
        found = self._best_spread(job, self._eligible_kinds(job))
        if found is None:
            self._fails.add(shape)
        return found

    def _spread_candidates(
        self, ki: _KindIndex, per: int, host: tuple[int, int]
    ) -> dict[str, list[tuple[int, int]]]:
        """Per topology group, (free count, node position) of the nodes that hold a member
        (`per` wholly free GPUs of this kind and the host share), tightest first."""
        by_group: dict[str, list[tuple[int, int]]] = {}
        nodes = self._nodes
        check = self._host and (host[0] or host[1])
        for count in range(per, len(ki.buckets)):
            if not (ki.bmask >> count) & 1:
                continue
            for pos in ki.buckets[count]:
                node = nodes[pos]
                if check and not node.host_fits(*host):
                    continue
                by_group.setdefault(node.group, []).append((count, pos))
        return by_group

    def _best_spread(self, job: Any, kinds: list[_KindIndex]) -> Members | None:
        """Per GPU kind, nodes are scanned from the fewest free GPUs up (fragmentation-aware:
        from the free count where a member raises fragmentation least up); the first count
        at which one group holds every member settles that kind (the group whose members
        leave the fewest GPUs behind, or raise fragmentation least), so a busy fleet is not
        scanned whole. Only when no group can hold them all are the members spread over the
        fewest groups."""
        need, per = node_count(job), per_node_gpus(job)
        host = host_request(job)
        check = self._host and (host[0] or host[1])
        same_group = bool(job.same_group)
        nodes = self._nodes
        scorer = self.scorer()
        best: tuple[tuple[Any, ...], _KindIndex, list[tuple[int, int]]] | None = None
        for ki in kinds:
            if ki.whole_total < need * per:
                continue
            kind = (ki.model, ki.memory_mb)
            level: dict[int, float] = {}
            counts_order: list[int] = list(range(per, len(ki.buckets)))
            if scorer is not None:
                level = {c: scorer.whole(kind, c, per) for c in counts_order}
                counts_order.sort(key=lambda c: (level[c], c))
            else:
                level = {c: float(c) for c in counts_order}
            by_group: dict[str, list[tuple[int, int]]] = {}
            found: tuple[tuple[Any, ...], list[tuple[int, int]]] | None = None
            for count in counts_order:
                if best is not None and best[0][0] == 1 and level[count] > best[0][1]:
                    break
                if not (ki.bmask >> count) & 1:
                    continue
                for pos in ki.buckets[count]:
                    if check and not nodes[pos].host_fits(*host):
                        continue
                    by_group.setdefault(nodes[pos].group, []).append((count, pos))
                complete = [
                    (sum(level[c] for c, _ in cands[:need]), group)
                    for group, cands in by_group.items()
                    if len(cands) >= need and (group or not same_group)
                ]
                if complete:
                    total, group = min(complete)
                    found = ((1, level[count], total), by_group[group][:need])
                    break
            if found is None and not same_group:
                picked = spread(by_group, need, False)
                if picked is not None:
                    groups, chosen = picked
                    levels = [level[c] for c, _ in chosen]
                    found = ((groups, max(levels), sum(levels)), chosen)
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], ki, found[1])
        if best is None:
            return None
        _, ki, chosen = best
        kind = (ki.model, ki.memory_mb)
        out = []
        for _, pos in chosen:
            node = nodes[pos]
            out.append(Member(node.name, tuple(node.gpus[p].index for p in node.whole[kind][:per])))
        return tuple(out)

    def fits_members(self, job: Any, members: Members) -> bool:
        """Whether the job fits on exactly these members now: one per node it spans, each
        on its own node, every GPU of one kind, in one group when it says same_group."""
        if len(members) != node_count(job) or len({m.node for m in members}) != len(members):
            return False
        kinds: set[Kind] = set()
        groups = set()
        for m in members:
            if not self.fits(job, m.node, m.gpu_indices):
                return False
            n = self._by_name[m.node]
            kinds.update(n.kind_of[n.index_of[i]] for i in m.gpu_indices)
            groups.add(n.group)
        if getattr(job, "same_group", False) and len(members) > 1:
            if len(groups) != 1 or "" in groups:
                return False
        return len(kinds) == 1

    def member_room(self, job: Any) -> tuple[int, int, int]:
        """For a multi-node gang, over the GPU kind with the most: nodes with a member's
        GPUs wholly free, those of them with its host CPUs and memory too, and the most
        of the latter in one topology group (for explanations)."""
        per, host = per_node_gpus(job), host_request(job)
        best = (0, 0, 0)
        for ki in self._eligible_kinds(job):
            ready = sum(len(ki.buckets[c]) for c in range(per, len(ki.buckets)))
            by_group = self._spread_candidates(ki, per, host)
            with_host = sum(len(c) for c in by_group.values())
            in_group = max((len(c) for g, c in by_group.items() if g), default=0)
            best = max(best, (ready, with_host, in_group))
        return best

    def shapes_that_fit(self, jobs: Any) -> set[tuple[Any, ...]]:
        """Request shapes among `jobs` that fit somewhere now (one best_fit per shape)."""
        seen: dict[tuple[Any, ...], Any] = {}
        for job in jobs:
            seen.setdefault(self.shape(job), job)
        return {shape for shape, job in seen.items() if self.best_fit_members(job) is not None}


def spread(
    by_group: dict[str, list[tuple[int, int]]], need: int, same_group: bool
) -> tuple[int, list[tuple[int, int]]] | None:
    """Pick `need` nodes from per-group candidates ((free count, position), tightest first):
    (groups used, picks), or None. One group when some group holds them all (the one whose
    picks leave the fewest GPUs behind); else, unless `same_group`, the biggest groups first,
    which uses the fewest groups, taking the tightest nodes of the last one. Nodes without
    a group ("") never satisfy `same_group`; one member needs no group."""
    same_group = same_group and need > 1
    whole = [
        (sum(c for c, _ in cands[:need]), group)
        for group, cands in by_group.items()
        if len(cands) >= need and (group or not same_group)
    ]
    if whole:
        _, group = min(whole)
        return 1, by_group[group][:need]
    if same_group:
        return None
    if sum(len(c) for c in by_group.values()) < need:
        return None
    picks: list[tuple[int, int]] = []
    groups = 0
    for group in sorted(by_group, key=lambda g: (-len(by_group[g]), g)):
        groups += 1
        picks.extend(by_group[group][: need - len(picks)])
        if len(picks) >= need:
            break
    return groups, picks
