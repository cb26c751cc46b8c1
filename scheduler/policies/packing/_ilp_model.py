"""The integer program behind the `ilp` policy, over classes of identical capacity, solved by
HiGHS (highspy) under deterministic work limits.

Its size grows with the number of distinct shapes in the fleet and the queue, not with the
number of nodes:

- **Slot classes.** A slot is the wholly free GPUs of one kind (model, memory) on one node;
  slots with the same kind, the same count and the same "idle node" flag are one class.
  `n[k, pattern]` (integer) counts the nodes of class `k` filled by a pattern: a multiset of
  gang sizes and of GPUs opened to fractions, within the slot. Every node of a class is the
  same for every job, so the pattern counts say all there is to say.
- **Gangs** of a class (GPU count, model, min memory): `x[c, k]` gangs of class `c` on slot
  class `k`; per slot class and size, the gangs equal the parts of that size the patterns
  hold (exact: a pattern fits a node, and any gang of that size fits any part).
- **GPU classes** for fractions: partly used GPUs of one kind with the same free memory and
  compute (a count), and per kind the GPUs the patterns open (a variable count).
  `y[f, g]` fractions of class `f` on GPU class `g`; per GPU class, memory and compute
  summed over the class, and the fractions that each need more than half a GPU at most
  one per GPU. This is a relaxation of packing each GPU, so the decoding (first fit
  decreasing over the class's GPUs, in name and index order) may leave a fraction out;
  it is then offered the free capacity by best fit, and the plan's notes count it.
- `p[j]` (binary) per job: placed; per job class, placed = put somewhere; per team and
  user, GPU equivalents placed <= headroom.

Objective: maximise the placed value, less a packing term (`PackingTerm`) scaled so that
the costliest pattern or fraction is worth half the least valuable job (it orders plans;
it never costs a placement). With fleet's fragmentation-aware placement (the default) a
pattern costs the scorer's rise for taking its GPUs on a node with that many free, an
opened GPU the whole-GPU demand it loses, and a fraction the rise for it on its GPU class,
so the ILP keeps the free blocks the demand needs as the placement does (docs/packing.md);
with `placement` "best_fit", fixed costs consolidate onto partly used nodes and GPUs and
open idle nodes last.

Candidates are bounded: each fraction class sees only the GPU classes cheapest for the
packing term (then tightest) that hold CANDIDATE_COVER times its jobs, and the opened GPUs
of each kind it may use; patterns hold at most as many parts of a size as there are jobs
of that size.

Limits count work (HiGHS `mip_max_nodes`, `mip_max_leaves`; HiGHS has no deterministic work
unit yet, and its `simplex_iteration_limit` did not stop a MIP solve in HiGHS 1.16), so the
same input gives the same plan on an idle and on a loaded machine; the wall-clock limit is
only a safety net.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from scheduler.core.fragmentation import Scorer
from scheduler.core.model import FULL_COMPUTE, GpuState, NodeState, PendingJob
from scheduler.policies.packing._ilp_classes import (
    OPEN,
    GpuClass,
    Kind,
    frac_class,
    gang_class,
    partial_classes,
    patterns,
    slot_classes,
)
from scheduler.policies.packing._ilp_decode import decode_fractions, decode_gangs
from scheduler.policies.packing._ilp_highs import IlpResult, Limits, Model, run_highs

__all__ = ["IlpResult", "Limits", "PackingTerm", "packing_cost", "patterns", "solve"]

Eligible = Callable[[PendingJob, NodeState, GpuState], bool]

# Without a fragmentation scorer (placement "best_fit"), the packing term's fixed costs:
OPEN_NODE = 8.0  # a pattern on an idle node
LEFT_FREE = 1.25  # per GPU a pattern leaves wholly free on an idle node
BUSY_REWARD = -1.0  # per GPU a pattern uses on a node that is already partly used
BUSY_LEFT = 0.25  # per GPU a pattern leaves wholly free on a partly used node it touches
OPEN_GPU = 2.0  # per wholly free GPU opened to fractions
FRACTION_ROOM = 0.5  # per fraction, times the free compute share of its GPU class
# The largest cost of one pattern or one fraction is this share of the least job value.
SHARE_OF_LEAST_VALUE = 0.5
CANDIDATE_COVER = 4  # a fraction class sees GPU classes holding this many times its jobs
MIN_CANDIDATES = 4


class PackingTerm:
    """Costs of the packing term. With a fragmentation scorer (fleet's default placement),
    a pattern costs the scorer's rise for taking its GPUs on a node with that many free
    (`Scorer.whole`), and a fraction the rise for it on its GPU class
    (`Scorer.fraction_partial`), so the ILP keeps free blocks that the demand needs, as
    the placement does; without one, fixed costs that consolidate onto busy nodes.
    `scale` turns costs into value units: the largest cost of a pattern or a fraction in
    the model is SHARE_OF_LEAST_VALUE of the least valuable job, so no cost ever outweighs
    placing a job."""

    def __init__(self, scorer: Scorer | None) -> None:
        self.scorer = scorer
        self.scale = 0.0

    def pattern(self, kind: Kind, free: int, idle: bool, used: int) -> float:
        if self.scorer is not None:
            return self.scorer.whole(kind, free, used)
        left = free - used
        if idle:
            return OPEN_NODE + LEFT_FREE * left
        return BUSY_REWARD * used + BUSY_LEFT * left

    def fraction(self, kind: Kind, free_compute: int, free_mb: int, q: int, mb: int) -> float:
        if self.scorer is not None:
            return self.scorer.fraction_partial(kind, free_compute, free_mb, q, mb)
        return FRACTION_ROOM * free_compute / FULL_COMPUTE

    def open_gpu(self, kind: Kind) -> float:
        """A wholly free GPU opened to fractions: whole-GPU shapes lose it (the fraction's
        own share is counted by `fraction`, as on a partly used GPU)."""
        if self.scorer is not None:
            return FULL_COMPUTE * sum(w for _, w in self.scorer.terms(kind).whole)
        return OPEN_GPU

    def set_scale(self, least_value: float, costs: Sequence[float]) -> None:
        most = max((abs(c) for c in costs), default=0.0)
        self.scale = SHARE_OF_LEAST_VALUE * least_value / most if most > 0 else 0.0


def solve(
    jobs: Sequence[PendingJob],
    values: Mapping[int, float],
    nodes: Sequence[NodeState],
    eligible: Eligible,
    team_headroom: Mapping[str, float],
    user_headroom: Mapping[tuple[str, str], float],
    limits: Limits | None = None,
    max_variables: int | None = None,
    relax: bool = False,
    packing: PackingTerm | None = None,
) -> IlpResult:
    """Place the most valuable set of `jobs` (each fits on one node and asks for GPUs only).

    `relax=True` solves the LP relaxation (its value bounds the integer optimum);
    without `packing` the objective is the placed value alone; with it, its `scale` is
    set here (the costs of this model against its least valuable job).
    """
    limits = limits or Limits()
    m = Model()
    members: list[PendingJob]
    raw_costs: dict[int, float] = {}  # column -> packing cost, before scaling
    p_col = {job.id: m.col(1.0, -values[job.id]) for job in jobs}

    gang_classes: dict[tuple[int, str, int], list[PendingJob]] = {}
    frac_classes: dict[tuple[int, int, str, int], list[PendingJob]] = {}
    for job in jobs:
        if job.is_fractional:
            frac_classes.setdefault(frac_class(job), []).append(job)
        else:
            gang_classes.setdefault(gang_class(job), []).append(job)
    gkeys, fkeys = sorted(gang_classes), sorted(frac_classes)

    sclasses = slot_classes(nodes)
    kinds_rep: dict[Kind, tuple[NodeState, GpuState]] = {}
    for sc in sclasses:
        kinds_rep.setdefault(sc.kind, sc.rep)
    kind_list = sorted(kinds_rep)

    def ok(job: PendingJob, rep: tuple[NodeState, GpuState]) -> bool:
        return eligible(job, rep[0], rep[1])

    # Fraction classes that may open a GPU of each kind (a whole GPU holds one of them).
    opens_kind: dict[Kind, int] = {}
    for fkey in fkeys:
        rep_job = frac_classes[fkey][0]
        mem, comp = max(fkey[0], 1), max(fkey[1], 1)
        for kind in kind_list:
            if mem <= kind[1] and comp <= FULL_COMPUTE and ok(rep_job, kinds_rep[kind]):
                opens_kind[kind] = opens_kind.get(kind, 0) + len(frac_classes[fkey])

    # Slot classes: pattern columns, and per (slot class, size) the parts they offer.
    parts_cols: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (k, size) -> [(col, n)]
    pat_cols: list[list[tuple[int, tuple[int, ...]]]] = []
    for k, sc in enumerate(sclasses):
        counts: dict[int, int] = {}
        for key in gkeys:
            size = key[0]
            if size <= sc.size and ok(gang_classes[key][0], sc.rep):
                counts[size] = counts.get(size, 0) + len(gang_classes[key])
        if opens_kind.get(sc.kind):
            counts[OPEN] = min(sc.size, opens_kind[sc.kind])
        cols = []
        for pat in patterns(sc.size, counts) if counts else []:
            used = sum(max(s, 1) for s in pat)
            col = m.col(len(sc.slots))
            if packing is not None:
                raw_costs[col] = packing.pattern(sc.kind, sc.size, sc.idle, used)
                raw_costs[col] += packing.open_gpu(sc.kind) * pat.count(OPEN)
            cols.append((col, pat))
            for s in set(pat):
                parts_cols.setdefault((k, s), []).append((col, pat.count(s)))
        pat_cols.append(cols)
        if cols:
            m.row([(c, 1.0) for c, _ in cols], -np.inf, float(len(sc.slots)))

    # Gangs: x[c, k], tied to the parts of their size and to their jobs.
    x_cols: dict[tuple[int, str, int], list[tuple[int, int]]] = {}
    by_part: dict[tuple[int, int], list[int]] = {}
    for key in gkeys:
        members = gang_classes[key]
        for k, sc in enumerate(sclasses):
            if (k, key[0]) in parts_cols and ok(members[0], sc.rep):
                fit = len(sc.slots) * (sc.size // key[0])
                col = m.col(min(fit, len(members)))
                x_cols.setdefault(key, []).append((k, col))
                by_part.setdefault((k, key[0]), []).append(col)
    for (k, s), part in sorted(parts_cols.items()):
        if s == OPEN:
            continue
        terms = [(c, 1.0) for c in by_part.get((k, s), [])]
        terms += [(c, -float(n)) for c, n in part]
        m.row(terms, 0.0, 0.0)

    # GPU classes for fractions: partly used ones, then the opened GPUs of each kind.
    gclasses = partial_classes(nodes)
    open_terms: dict[Kind, list[tuple[int, float]]] = {}
    for k, sc in enumerate(sclasses):
        for col, n in parts_cols.get((k, OPEN), []):
            open_terms.setdefault(sc.kind, []).append((col, float(n)))
    for kind in sorted(open_terms):
        rep = kinds_rep[kind]
        gclasses.append(GpuClass(kind, kind[1], FULL_COMPUTE, rep, opened=True))
    y_cols: dict[tuple[int, int, str, int], list[tuple[int, int]]] = {}
    uses: dict[int, list[tuple[int, int, int]]] = {}  # g -> [(col, mem, comp)]
    for fkey in fkeys:
        fmembers = frac_classes[fkey]
        mem, comp = max(fkey[0], 1), max(fkey[1], 1)
        fits = []
        for g, gc in enumerate(gclasses):
            per_gpu = min(gc.free_memory_mb // mem, gc.free_compute // comp)
            if per_gpu > 0 and ok(fmembers[0], gc.rep):
                fits.append((g, per_gpu))

        # Cheapest for the packing term first, then tightest (least compute, then memory,
        # left after one), until they hold CANDIDATE_COVER times the class's jobs; opened
        # GPUs always stay candidates.
        def rank(
            f: tuple[int, int], q: int = fkey[1], mb: int = fkey[0]
        ) -> tuple[float, int, int, int]:
            gc = gclasses[f[0]]
            cost = 0.0
            if packing is not None:
                cost = packing.fraction(gc.kind, gc.free_compute, gc.free_memory_mb, q, mb)
            return (cost, gc.free_compute - q, gc.free_memory_mb - mb, f[0])

        partial = sorted((f for f in fits if not gclasses[f[0]].opened), key=rank)
        chosen: list[tuple[int, int]] = []
        held = 0
        for g, per_gpu in partial:
            if held >= CANDIDATE_COVER * len(fmembers) and len(chosen) >= MIN_CANDIDATES:
                break
            chosen.append((g, per_gpu))
            held += per_gpu * len(gclasses[g].gpus)
        chosen += [f for f in fits if gclasses[f[0]].opened]
        for g, per_gpu in sorted(chosen):
            gc = gclasses[g]
            ub = len(fmembers) if gc.opened else min(len(fmembers), per_gpu * len(gc.gpus))
            col = m.col(ub)
            if packing is not None:
                raw_costs[col] = packing.fraction(
                    gc.kind, gc.free_compute, gc.free_memory_mb, fkey[1], fkey[0]
                )
            y_cols.setdefault(fkey, []).append((g, col))
            uses.setdefault(g, []).append((col, mem, comp))
    for g, use in sorted(uses.items()):
        gc = gclasses[g]
        big = [
            (c, 1.0)
            for c, mem, comp in use
            if 2 * mem > gc.free_memory_mb or 2 * comp > gc.free_compute
        ]
        if gc.opened:
            opening = open_terms[gc.kind]
            for need, free in ((1, gc.free_memory_mb), (2, gc.free_compute)):
                terms = [(u[0], float(u[need])) for u in use]
                m.row(terms + [(c, -free * n) for c, n in opening], -np.inf, 0.0)
            if big:
                m.row(big + [(c, -n) for c, n in opening], -np.inf, 0.0)
        else:
            count = len(gc.gpus)
            for need, free in ((1, gc.free_memory_mb), (2, gc.free_compute)):
                m.row([(u[0], float(u[need])) for u in use], -np.inf, float(free * count))
            if big:
                m.row(big, -np.inf, float(count))
    # Opening a GPU is worth it only with a fraction on it.
    for kind, opening in sorted(open_terms.items()):
        g = next(i for i, gc in enumerate(gclasses) if gc.opened and gc.kind == kind)
        ys = [(u[0], 1.0) for u in uses.get(g, [])]
        m.row(ys + [(c, -times) for c, times in opening], 0.0, np.inf)

    # Per job class: placed jobs = jobs put somewhere.
    class_cols: list[tuple[list[PendingJob], list[tuple[int, int]]]] = [
        (gang_classes[k], x_cols.get(k, [])) for k in gkeys
    ] + [(frac_classes[k], y_cols.get(k, [])) for k in fkeys]
    for members, placed in class_cols:
        where = [(col, 1.0) for _, col in placed]
        m.row(where + [(p_col[j.id], -1.0) for j in members], 0.0, 0.0)

    # Quotas: team hard limits and per-user caps, in GPU equivalents.
    quota: dict[tuple[str, object], tuple[list[tuple[int, float]], float]] = {}
    for job in jobs:
        for qkey, room in (
            (("team", job.team), team_headroom.get(job.team)),
            (("user", (job.team, job.user)), user_headroom.get((job.team, job.user))),
        ):
            if room is not None:
                quota.setdefault(qkey, ([], room))[0].append((p_col[job.id], job.gpu_equivalent))
    for terms, room in quota.values():
        m.row(terms, -np.inf, float(room))

    if packing is not None:
        packing.set_scale(min((values[j.id] for j in jobs), default=1.0), list(raw_costs.values()))
        for col, cost in raw_costs.items():
            m.cost[col] += packing.scale * cost
    n = len(m.upper)
    result = IlpResult(status="none", message="", n_vars=n, n_rows=len(m.lower_b))
    result.n_slot_classes, result.n_gpu_classes = len(sclasses), len(gclasses)
    if max_variables is not None and n > max_variables:
        result.status, result.message = "too_large", f"{n} variables > {max_variables}"
        return result

    x = run_highs(m, limits, relax, result)
    if x is None or relax:
        return result
    xi = np.rint(x).astype(np.int64)
    chosen_ids = {jid for jid, col in p_col.items() if xi[col] > 0}
    result.value = float(sum(values[j] for j in chosen_ids))
    opened = decode_gangs(result, xi, chosen_ids, sclasses, pat_cols, gang_classes, x_cols)
    decode_fractions(result, xi, chosen_ids, gclasses, opened, frac_classes, y_cols)
    return result


def packing_cost(
    term: PackingTerm,
    nodes: Sequence[NodeState],
    gangs: Mapping[int, tuple[str, tuple[int, ...]]],
    fractions: Mapping[int, tuple[str, int, int, int]],
) -> float:
    """The packing term of concrete placements (value units), as the model charges it, so
    a plan from elsewhere (greedy's) is scored on the solver's own objective. `fractions`
    maps a job to (node, GPU, compute percent, memory MB)."""
    taken: set[tuple[str, int]] = set()
    on_gpu: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for node, indices in gangs.values():
        taken.update((node, i) for i in indices)
    for node, index, q, mb in fractions.values():
        on_gpu.setdefault((node, index), []).append((q, mb))
    cost = 0.0
    for state in nodes:
        by_kind: dict[Kind, list[GpuState]] = {}
        for gpu in state.gpus:
            kind = (gpu.model, gpu.memory_mb)
            key = (state.name, gpu.index)
            if gpu.is_whole_free:
                by_kind.setdefault(kind, []).append(gpu)
                if key in on_gpu:
                    taken.add(key)
                    cost += term.open_gpu(kind)
                free_q, free_mb = FULL_COMPUTE, gpu.memory_mb
            else:
                free_q, free_mb = gpu.free_compute_percent, min(gpu.free_memory_mb, gpu.memory_mb)
            for q, mb in on_gpu.get(key, []):
                cost += term.fraction(kind, free_q, free_mb, q, mb)
        for kind, gpus in by_kind.items():
            used = sum((state.name, g.index) in taken for g in gpus)
            if used:
                cost += term.pattern(kind, len(gpus), len(gpus) == len(state.gpus), used)
    return term.scale * cost
