"""The integer program behind the `ilp` policy, built with numpy/scipy and solved by HiGHS.

Variables (all binary):
- `x[j, s]`: gang `j` goes to slot `s`, a slot being the wholly free GPUs of one node that
  share model and memory (a gang stays within one node and one GPU kind);
- `y[j, g]`: fractional job `j` goes to GPU `g` (a partly used GPU, or a wholly free one);
- `z[g]`: wholly free GPU `g` is opened to fractions, and so is no longer given to gangs.

Rows: each job placed at most once; per slot, gang GPUs plus opened GPUs <= free GPUs; per
GPU, fractions' memory and compute <= what is free (times `z` for wholly free GPUs); per team
and per user, GPU equivalents placed <= headroom under the hard limit / user cap.

Reductions: variables exist only for eligible (job, slot/GPU) pairs that fit on their own;
wholly free GPUs of a slot are interchangeable, so only the first few may be opened, in
order; identical idle nodes are interchangeable, so the k-th gang (in queue order) that
could use such a group may only use its first k nodes.
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


def _shape(job: PendingJob) -> tuple[str | None, int | None, bool]:
    return job.gpu_model, job.min_gpu_memory_mb, job.is_fractional


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
) -> IlpResult:
    """Maximise the value of placed jobs. `jobs` come in queue order (used for symmetry).

    Status "too_large" when the model would exceed `max_variables` (nothing is solved);
    `relax=True` solves the LP relaxation (its objective bounds the integer optimum).
    """
    by_name = {n.name: n for n in nodes}
    slots, reps = build_slots(nodes)
    gangs = [j for j in jobs if not j.is_fractional]
    fracs = [j for j in jobs if j.is_fractional]

    # Eligibility depends on the job's shape (model, min memory), not on the job itself.
    shape_ok: dict[tuple[tuple[str | None, int | None, bool], int], bool] = {}

    def slot_ok(job: PendingJob, s: int) -> bool:
        key = (_shape(job), s)
        if key not in shape_ok:
            shape_ok[key] = eligible(job, by_name[slots[s].node], reps[s])
        return shape_ok[key]

    # Groups of identical idle nodes (same GPU kind and count), in node-name order.
    groups: dict[tuple[str, int, int], list[int]] = {}
    for s, slot in enumerate(slots):
        if slot.idle_node:
            groups.setdefault((reps[s].model, reps[s].memory_mb, len(slot.indices)), []).append(s)
    group_of = {s: (key, pos) for key, members in groups.items() for pos, s in enumerate(members)}
    group_seen: dict[tuple[str, int, int], int] = {}

    x_vars: list[tuple[int, int]] = []  # (job id, slot)
    slot_sizes = np.array([len(s.indices) for s in slots], dtype=np.int64)
    for job in gangs:
        fits = np.nonzero(slot_sizes >= job.gpus)[0]
        used_groups: set[tuple[str, int, int]] = set()
        for s in fits.tolist():
            if not slot_ok(job, s):
                continue
            if s in group_of:
                key, pos = group_of[s]
                if pos > group_seen.get(key, 0):
                    continue
                used_groups.add(key)
            x_vars.append((job.id, s))
        for key in used_groups:
            group_seen[key] = group_seen.get(key, 0) + 1

    # GPUs fractions may use: partly used ones with room, and the first few wholly free ones
    # of each slot (they are interchangeable, so at most one per fractional job is useful).
    frac_gpus: list[FracGpu] = []
    frac_rep: list[tuple[NodeState, GpuState]] = []
    if fracs:
        opened_cap = len(fracs)
        for node in nodes:
            for gpu in node.gpus:
                if (
                    not gpu.is_whole_free
                    and gpu.free_memory_mb > 0
                    and gpu.free_compute_percent > 0
                ):
                    frac_gpus.append(
                        FracGpu(
                            node.name, gpu.index, gpu.free_memory_mb, gpu.free_compute_percent, None
                        )
                    )
                    frac_rep.append((node, gpu))
        for s, slot in enumerate(slots):
            node = by_name[slot.node]
            gpu_by_index = {g.index: g for g in node.gpus}
            for index in slot.indices[:opened_cap]:
                gpu = gpu_by_index[index]
                frac_gpus.append(FracGpu(node.name, index, gpu.memory_mb, FULL_COMPUTE, s))
                frac_rep.append((node, gpu))
    y_vars: list[tuple[int, int]] = []  # (job id, frac gpu)
    if fracs:
        g_mem = np.array([g.free_memory_mb for g in frac_gpus], dtype=np.int64)
        g_cmp = np.array([g.free_compute for g in frac_gpus], dtype=np.int64)
        for job in fracs:
            mem, cmp_ = _frac_need(job)
            for g in np.nonzero((g_mem >= mem) & (g_cmp >= cmp_))[0].tolist():
                node, gpu = frac_rep[g]
                if eligible(job, node, gpu):
                    y_vars.append((job.id, g))
    z_gpus = sorted({g for _, g in y_vars if frac_gpus[g].slot is not None})

    nx, ny, nz = len(x_vars), len(y_vars), len(z_gpus)
    n = nx + ny + nz
    result = IlpResult(status="none", message="", n_vars=n)
    if max_variables is not None and n > max_variables:
        result.status, result.message = "too_large", f"{n} variables > {max_variables}"
        return result
    if n == 0:
        result.status, result.message, result.objective = "optimal", "nothing fits", 0.0
        return result
    z_col = {g: nx + ny + k for k, g in enumerate(z_gpus)}
    job_by_id = {j.id: j for j in jobs}
    cost = np.zeros(n)
    cost[: nx + ny] = [-values[jid] for jid, _ in x_vars] + [-values[jid] for jid, _ in y_vars]

    rows = _Rows()
    per_job: dict[int, list[int]] = {}
    for col, (jid, _) in enumerate(x_vars):
        per_job.setdefault(jid, []).append(col)
    for k, (jid, _) in enumerate(y_vars):
        per_job.setdefault(jid, []).append(nx + k)
    for cols in per_job.values():
        if len(cols) > 1:
            rows.add(cols, [1.0] * len(cols), -np.inf, 1.0)

    # Per slot: gang GPUs + opened GPUs <= wholly free GPUs.
    slot_cols: dict[int, tuple[list[int], list[float]]] = {}
    for col, (jid, s) in enumerate(x_vars):
        c, v = slot_cols.setdefault(s, ([], []))
        c.append(col)
        v.append(float(job_by_id[jid].gpus))
    for g in z_gpus:
        c, v = slot_cols.setdefault(frac_gpus[g].slot, ([], []))  # type: ignore[arg-type]
        c.append(z_col[g])
        v.append(1.0)
    for s, (c, v) in slot_cols.items():
        if sum(v) > len(slots[s].indices):
            rows.add(c, v, -np.inf, float(len(slots[s].indices)))

    # Per GPU: memory and compute of fractions; wholly free GPUs only once opened.
    gpu_cols: dict[int, list[int]] = {}
    for k, (_, g) in enumerate(y_vars):
        gpu_cols.setdefault(g, []).append(k)
    for g, ks in gpu_cols.items():
        fg = frac_gpus[g]
        for need_index, free in ((0, fg.free_memory_mb), (1, fg.free_compute)):
            needs = [float(_frac_need(job_by_id[y_vars[k][0]])[need_index]) for k in ks]
            cols = [nx + k for k in ks]
            if fg.slot is None:
                if sum(needs) > free:
                    rows.add(cols, needs, -np.inf, float(free))
            else:
                rows.add(cols + [z_col[g]], needs + [-float(free)], -np.inf, 0.0)
        if fg.slot is not None:
            rows.add([nx + k for k in ks] + [z_col[g]], [1.0] * len(ks) + [-len(ks)], -np.inf, 0.0)
    # Open wholly free GPUs of a slot in index order (they are interchangeable).
    prev: dict[int, int] = {}
    for g in z_gpus:
        s = frac_gpus[g].slot
        assert s is not None
        if s in prev:
            rows.add([z_col[prev[s]], z_col[g]], [1.0, -1.0], 0.0, np.inf)
        prev[s] = g

    # Quotas: team hard limits and per-user caps, in GPU equivalents.
    groups_q: dict[tuple[str, object], tuple[list[int], list[float], float]] = {}
    for col, jid in enumerate([jid for jid, _ in x_vars] + [jid for jid, _ in y_vars]):
        job = job_by_id[jid]
        for key, room in (
            (("team", job.team), team_headroom.get(job.team)),
            (("user", (job.team, job.user)), user_headroom.get((job.team, job.user))),
        ):
            if room is None:
                continue
            c, v, _ = groups_q.setdefault(key, ([], [], room))
            c.append(col)
            v.append(job.gpu_equivalent)
    for c, v, room in groups_q.values():
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
        cost,
        integrality=np.zeros(n) if relax else np.ones(n),
        bounds=Bounds(np.zeros(n), np.ones(n)),
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
    chosen = res.x > 0.5
    for col in np.nonzero(chosen[:nx])[0].tolist():
        jid, s = x_vars[col]
        result.gangs[jid] = slots[s]
    for k in np.nonzero(chosen[nx : nx + ny])[0].tolist():
        jid, g = y_vars[k]
        result.fractions[jid] = (frac_gpus[g].node, frac_gpus[g].index)
        if frac_gpus[g].slot is not None:
            result.opened.add((frac_gpus[g].node, frac_gpus[g].index))
    return result


def _neg(value: float | None) -> float | None:
    return None if value is None else -float(value)
