"""The integer program behind the `ilp` policy, built with numpy/scipy and solved by HiGHS.

Jobs asking for the same resources form a class (gangs: GPU count, model, min memory;
fractions: memory, compute, model, min memory). Variables:
- `p[j]` (binary): job `j` is placed; the objective is the sum of placed jobs' values;
- `x[c, s]` (integer): gangs of class `c` in slot `s`, a slot being the wholly free GPUs of
  one node that share model and memory (a gang stays within one node and one GPU kind);
- `y[f, g]` (integer): fractions of class `f` on GPU `g` (partly used, or wholly free);
- `z[g]` (binary): wholly free GPU `g` is opened to fractions, so no gang gets it.

Rows: per class, jobs placed = jobs put somewhere; per slot, gang GPUs plus opened GPUs <=
free GPUs; per GPU, fractions' memory and compute <= what is free (times `z` for wholly
free GPUs); per team and user, GPU equivalents placed <= headroom under the hard limit or
the per-user cap.

Reductions: columns only for eligible (class, slot/GPU) pairs where one job fits; only the
first few wholly free GPUs of a slot may be opened, in index order; identical idle nodes
are loaded in name order (symmetry).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from scheduler.core.model import FULL_COMPUTE, GpuState, NodeState, PendingJob

Eligible = Callable[[PendingJob, NodeState, GpuState], bool]


@dataclass(frozen=True, slots=True)
class Slot:
    node: str
    indices: tuple[int, ...]  # wholly free GPUs of one kind on this node
    idle_node: bool  # every GPU of the node is wholly free and of this kind


@dataclass(frozen=True, slots=True)
class FracGpu:
    node: str
    index: int
    free_memory_mb: int
    free_compute: int
    slot: int | None  # the slot it belongs to when wholly free (it then needs z to be used)


@dataclass
class IlpResult:
    status: str  # "optimal", "feasible" (limit hit, incumbent kept), "none"
    message: str
    objective: float | None = None
    dual_bound: float | None = None
    mip_gap: float | None = None
    gangs: dict[int, Slot] = field(default_factory=dict)
    fractions: dict[int, tuple[str, int]] = field(default_factory=dict)
    opened: set[tuple[str, int]] = field(default_factory=set)
    n_vars: int = 0
    n_rows: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass
class _Rows:
    rows: list[np.ndarray] = field(default_factory=list)
    cols: list[np.ndarray] = field(default_factory=list)
    vals: list[np.ndarray] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)

    def add(self, cols: Sequence[int], vals: Sequence[float], lo: float, hi: float) -> None:
        r = len(self.lower)
        self.rows.append(np.full(len(cols), r, dtype=np.int64))
        self.cols.append(np.asarray(cols, dtype=np.int64))
        self.vals.append(np.asarray(vals, dtype=float))
        self.lower.append(lo)
        self.upper.append(hi)


def _frac_need(job: PendingJob) -> tuple[int, int]:
    return job.gpu_memory_mb or 0, job.gpu_compute_percent or 0


def build_slots(nodes: Sequence[NodeState]) -> tuple[list[Slot], list[GpuState]]:
    """Slots of wholly free GPUs, with a representative GPU of each for eligibility checks."""
    slots: list[Slot] = []
    reps: list[GpuState] = []
    for node in nodes:
        kinds: dict[tuple[str, int], list[GpuState]] = {}
        for gpu in node.gpus:
            if gpu.is_whole_free:
                kinds.setdefault((gpu.model, gpu.memory_mb), []).append(gpu)
        for gpus in kinds.values():
            idle = len(gpus) == len(node.gpus)
            slots.append(Slot(node.name, tuple(g.index for g in gpus), idle))
            reps.append(gpus[0])
    return slots, reps


def _gang_class(job: PendingJob) -> tuple[int, str | None, int | None]:
    return job.gpus, job.gpu_model, job.min_gpu_memory_mb


def _frac_class(job: PendingJob) -> tuple[int, int, str | None, int | None]:
    mem, comp = _frac_need(job)
    return mem, comp, job.gpu_model, job.min_gpu_memory_mb


class _Vars:
    """Columns of the model: upper bounds, integrality and objective, appended in blocks."""

    def __init__(self) -> None:
        self.upper: list[float] = []
        self.cost: list[float] = []

    def add(self, upper: float, cost: float = 0.0) -> int:
        self.upper.append(upper)
        self.cost.append(cost)
        return len(self.upper) - 1


def solve(
    jobs: Sequence[PendingJob],
    values: Mapping[int, float],
    nodes: Sequence[NodeState],
    eligible: Eligible,
    team_headroom: Mapping[str, float],
    user_headroom: Mapping[tuple[str, str], float],
    time_limit: float,
    max_variables: int | None = None,
    relax: bool = False,
    exact_variables: int | None = None,
) -> IlpResult:
    """Maximise the value of placed jobs.

    Jobs asking for the same resources (a class) are interchangeable for capacity, so the
    placement variables count jobs of a class per slot or GPU, and a binary `p[j]` per job
    says whether it is placed (value and quotas are per job). Status "too_large" when the
    model would exceed `max_variables` (nothing is solved); `relax=True` solves the LP
    relaxation (its objective bounds the integer optimum). Above `exact_variables`
    (fraction columns over wholly free GPUs), fractions may start only one wholly free GPU
    per slot, and `notes` says so.
    """
    by_name = {n.name: n for n in nodes}
    slots, reps = build_slots(nodes)
    result_notes: list[str] = []
    cols = _Vars()
    p_col = {job.id: cols.add(1.0, -values[job.id]) for job in jobs}

    gang_classes: dict[tuple, list[PendingJob]] = {}
    frac_classes: dict[tuple, list[PendingJob]] = {}
    for job in jobs:
        if job.is_fractional:
            frac_classes.setdefault(_frac_class(job), []).append(job)
        else:
            gang_classes.setdefault(_gang_class(job), []).append(job)

    # x[c, s]: how many gangs of class c go to slot s.
    x_cols: dict[tuple, list[tuple[int, int]]] = {}  # class -> [(slot, column)]
    slot_load: dict[int, tuple[list[int], list[float]]] = {}
    for key, members in gang_classes.items():
        rep_job, k = members[0], members[0].gpus
        for s, slot in enumerate(slots):
            fit = len(slot.indices) // k
            if fit and eligible(rep_job, by_name[slot.node], reps[s]):
                col = cols.add(float(min(fit, len(members))))
                x_cols.setdefault(key, []).append((s, col))
                c, v = slot_load.setdefault(s, ([], []))
                c.append(col)
                v.append(float(k))

    # GPUs fractions may use: partly used ones with room, and the first few wholly free ones
    # of each slot (interchangeable, so at most one per fractional job is useful).
    frac_gpus: list[FracGpu] = []
    frac_rep: list[tuple[NodeState, GpuState]] = []
    if frac_classes:
        opened_cap = sum(len(m) for m in frac_classes.values())
        whole = sum(min(len(slot.indices), opened_cap) for slot in slots)
        if exact_variables is not None and whole * len(frac_classes) > exact_variables:
            # Large fleets: fractions may start one wholly free GPU per slot (best fit does
            # the same: it fills a started GPU before starting another).
            opened_cap = 1
            result_notes.append(
                "ilp: model reduced: fractions may start at most one wholly free GPU per node"
            )
        for node in nodes:
            for gpu in node.gpus:
                mem, comp = min(gpu.free_memory_mb, gpu.memory_mb), gpu.free_compute_percent
                if not gpu.is_whole_free and mem > 0 and comp > 0:
                    frac_gpus.append(FracGpu(node.name, gpu.index, mem, comp, None))
                    frac_rep.append((node, gpu))
        for s, slot in enumerate(slots):
            node = by_name[slot.node]
            gpu_by_index = {g.index: g for g in node.gpus}
            for index in slot.indices[:opened_cap]:
                gpu = gpu_by_index[index]
                frac_gpus.append(FracGpu(node.name, index, gpu.memory_mb, FULL_COMPUTE, s))
                frac_rep.append((node, gpu))
    # y[f, g]: how many fractions of class f go to GPU g.
    y_cols: dict[tuple, list[tuple[int, int]]] = {}
    # Every fraction needs >= 1 % compute, so the compute row alone ties y to z.
    gpu_use: dict[int, list[tuple[int, int, int]]] = {}  # g -> [(col, mem, comp)]
    if frac_classes:
        g_mem = np.array([g.free_memory_mb for g in frac_gpus], dtype=np.int64)
        g_cmp = np.array([g.free_compute for g in frac_gpus], dtype=np.int64)
        for key, members in frac_classes.items():
            mem, comp = max(key[0], 1), max(key[1], 1)
            fit = np.minimum(g_mem // mem, g_cmp // comp)
            for g in np.nonzero(fit > 0)[0].tolist():
                node, gpu = frac_rep[g]
                if eligible(members[0], node, gpu):
                    ub = float(min(int(fit[g]), len(members)))
                    col = cols.add(ub)
                    y_cols.setdefault(key, []).append((g, col))
                    gpu_use.setdefault(g, []).append((col, mem, comp))
    z_col: dict[int, int] = {}
    for g in sorted(gpu_use):
        if frac_gpus[g].slot is not None:
            z_col[g] = cols.add(1.0)
            c, v = slot_load.setdefault(frac_gpus[g].slot, ([], []))  # type: ignore[arg-type]
            c.append(z_col[g])
            v.append(1.0)

    n = len(cols.upper)
    result = IlpResult(status="none", message="", n_vars=n, notes=result_notes)
    if max_variables is not None and n > max_variables:
        result.status, result.message = "too_large", f"{n} variables > {max_variables}"
        return result

    rows = _Rows()
    for classes, placed in ((gang_classes, x_cols), (frac_classes, y_cols)):
        for key, members in classes.items():
            where = [col for _, col in placed.get(key, [])]
            rows.add(
                where + [p_col[j.id] for j in members],
                [1.0] * len(where) + [-1.0] * len(members),
                0.0,
                0.0,
            )
    for s, (c, v) in slot_load.items():
        rows.add(c, v, -np.inf, float(len(slots[s].indices)))
    for g, uses in gpu_use.items():
        fg = frac_gpus[g]
        c = [u[0] for u in uses]
        for need_index, free in ((1, fg.free_memory_mb), (2, fg.free_compute)):
            needs = [float(u[need_index]) for u in uses]
            if fg.slot is None:
                rows.add(c, needs, -np.inf, float(free))
            else:
                rows.add(c + [z_col[g]], needs + [-float(free)], -np.inf, 0.0)
    # Symmetry: open a slot's wholly free GPUs in index order; load identical idle nodes in
    # name order (any plan can be relabelled to satisfy both).
    prev: dict[int, int] = {}
    for g in sorted(z_col):
        owner = frac_gpus[g].slot
        assert owner is not None
        if owner in prev:
            rows.add([z_col[prev[owner]], z_col[g]], [1.0, -1.0], 0.0, np.inf)
        prev[owner] = g
    groups: dict[tuple[str, int, int], list[int]] = {}
    for s, slot in enumerate(slots):
        if slot.idle_node:
            groups.setdefault((reps[s].model, reps[s].memory_mb, len(slot.indices)), []).append(s)
    for same in groups.values():
        for a, b in zip(same, same[1:], strict=False):
            ca, va = slot_load.get(a, ([], []))
            cb, vb = slot_load.get(b, ([], []))
            if cb:
                rows.add(ca + cb, va + [-x for x in vb], 0.0, np.inf)

    # Quotas: team hard limits and per-user caps, in GPU equivalents.
    quota_rows: dict[tuple[str, object], tuple[list[int], list[float], float]] = {}
    for job in jobs:
        for key, room in (
            (("team", job.team), team_headroom.get(job.team)),
            (("user", (job.team, job.user)), user_headroom.get((job.team, job.user))),
        ):
            if room is not None:
                c, v, _ = quota_rows.setdefault(key, ([], [], room))
                c.append(p_col[job.id])
                v.append(job.gpu_equivalent)
    for c, v, room in quota_rows.values():
        rows.add(c, v, -np.inf, float(room))

    result.n_rows = len(rows.lower)
    constraints = []
    if rows.lower:
        matrix = coo_matrix(
            (np.concatenate(rows.vals), (np.concatenate(rows.rows), np.concatenate(rows.cols))),
            shape=(len(rows.lower), n),
        ).tocsr()
        constraints.append(LinearConstraint(matrix, np.array(rows.lower), np.array(rows.upper)))
    res = milp(
        np.array(cols.cost),
        integrality=np.zeros(n) if relax else np.ones(n),
        bounds=Bounds(np.zeros(n), np.array(cols.upper)),
        constraints=constraints,
        options={"time_limit": max(float(time_limit), 0.0), "disp": False},
    )
    result.message = str(res.message)
    result.dual_bound = _neg(getattr(res, "mip_dual_bound", None))
    result.mip_gap = getattr(res, "mip_gap", None)
    if res.x is None:
        return result
    result.status = "optimal" if res.status == 0 else "feasible"
    result.objective = -float(res.fun)
    if relax:
        return result
    x = np.rint(res.x).astype(np.int64)
    chosen = {jid for jid, col in p_col.items() if x[col] > 0}
    for key, members in gang_classes.items():
        queue = [j.id for j in members if j.id in chosen]
        for s, col in x_cols.get(key, []):
            for _ in range(int(x[col])):
                if queue:
                    result.gangs[queue.pop(0)] = slots[s]
    for key, members in frac_classes.items():
        queue = [j.id for j in members if j.id in chosen]
        for g, col in y_cols.get(key, []):
            for _ in range(int(x[col])):
                if queue:
                    fg = frac_gpus[g]
                    result.fractions[queue.pop(0)] = (fg.node, fg.index)
                    if fg.slot is not None:
                        result.opened.add((fg.node, fg.index))
    return result


def _neg(value: float | None) -> float | None:
    return None if value is None else -float(value)
