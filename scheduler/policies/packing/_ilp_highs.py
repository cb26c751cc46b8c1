"""Building and solving the ILP's matrix with HiGHS (highspy) under work limits, and what
one solve reports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import highspy
import numpy as np
from highspy.highs import _Highs
from scipy.sparse import coo_matrix


@dataclass(frozen=True, slots=True)
class Limits:
    """Work limits of one solve (HiGHS options), and the wall-clock safety net."""

    max_bb_nodes: int = 2000
    max_leaves: int = 1000
    time_limit: float = 30.0


@dataclass
class IlpResult:
    # "optimal"; "feasible" (a limit hit, incumbent kept); "none" (no solution: infeasible
    # or a limit hit first); "too_large" (not built: above max_variables).
    status: str
    message: str
    objective: float | None = None  # the solver's objective: value less packing term
    value: float | None = None  # placed value of the solver's choice
    dual_bound: float | None = None
    mip_gap: float | None = None
    gangs: dict[int, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    fractions: dict[int, tuple[str, int]] = field(default_factory=dict)
    unmapped: list[int] = field(default_factory=list)  # chosen, but left out by decoding
    n_vars: int = 0
    n_rows: int = 0
    n_slot_classes: int = 0
    n_gpu_classes: int = 0
    bb_nodes: int = 0
    simplex_iterations: int = 0
    limit: str | None = None  # which limit stopped the solve, if one did
    notes: list[str] = field(default_factory=list)


class Model:
    """Columns (bounds, cost) and rows, appended as the model is built."""

    def __init__(self) -> None:
        self.upper: list[float] = []
        self.cost: list[float] = []
        self.r_idx: list[int] = []
        self.c_idx: list[int] = []
        self.vals: list[float] = []
        self.lower_b: list[float] = []
        self.upper_b: list[float] = []

    def col(self, upper: float, cost: float = 0.0) -> int:
        self.upper.append(float(upper))
        self.cost.append(float(cost))
        return len(self.upper) - 1

    def row(self, terms: Sequence[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(self.lower_b)
        for c, v in terms:
            self.r_idx.append(r)
            self.c_idx.append(c)
            self.vals.append(float(v))
        self.lower_b.append(lo)
        self.upper_b.append(hi)


def run_highs(m: Model, limits: Limits, relax: bool, result: IlpResult) -> np.ndarray | None:
    n = len(m.upper)
    # highspy's `Highs` wrapper enables callbacks in its constructor, and that first call
    # prints HiGHS's banner before any option can be set; the core class it wraps does not.
    # Options first, so nothing is printed.
    h = _Highs()
    options: dict[str, Any] = {
        "output_flag": False,
        "random_seed": 0,
        "time_limit": max(float(limits.time_limit), 0.0),
        "mip_max_nodes": int(limits.max_bb_nodes),
        "mip_max_leaves": int(limits.max_leaves),
    }
    for key, value in options.items():
        h.setOptionValue(key, value)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, len(m.lower_b)
    lp.col_cost_ = np.array(m.cost)
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.array(m.upper)
    lp.row_lower_ = np.array(m.lower_b)
    lp.row_upper_ = np.array(m.upper_b)
    matrix = coo_matrix(
        (np.array(m.vals), (np.array(m.r_idx, dtype=np.int64), np.array(m.c_idx, dtype=np.int64))),
        shape=(len(m.lower_b), n),
    ).tocsc()
    matrix.sum_duplicates()
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = matrix.indptr
    lp.a_matrix_.index_ = matrix.indices
    lp.a_matrix_.value_ = matrix.data
    if not relax:
        lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    result.message = h.modelStatusToString(status)
    result.bb_nodes = int(info.mip_node_count) if not relax else 0
    result.simplex_iterations = int(info.simplex_iteration_count)
    limit_names = {
        highspy.HighsModelStatus.kTimeLimit: "time",
        highspy.HighsModelStatus.kSolutionLimit: "branch-and-bound nodes or leaves",
    }
    result.limit = limit_names.get(status)
    has_solution = info.primal_solution_status == 2  # feasible
    if not has_solution:
        return None
    result.status = "optimal" if status == highspy.HighsModelStatus.kOptimal else "feasible"
    result.objective = -float(info.objective_function_value)
    if not relax:
        result.dual_bound = -float(info.mip_dual_bound)
        result.mip_gap = float(info.mip_gap)
    return np.array(h.getSolution().col_value)
