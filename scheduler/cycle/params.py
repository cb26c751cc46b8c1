"""The scheduler's parameters: what each one is (type, default, range, help), gathered
from what the cycle and the registered policies read, and the check of a set of values
against them, which refuses a typo or a wrong type with a sentence rather than letting the
next cycle ignore it. `scheduler.cycle.config` keeps the settings row that holds them."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from fleet.errors import ApplicationError
from scheduler.core.usage import DEFAULT_HALF_LIFE


@dataclass(frozen=True)
class Param:
    kind: str  # "bool", "int", "number", "str", "numbers" (list), "ranks" (name -> int)
    default: Any = None
    minimum: float | None = None
    choices: tuple[str, ...] = ()
    help: str = ""
    # Every number has an upper bound too: a value far past any sensible one (a population
    # of 10**8, an ILP time limit of a day) would stall the cycle or exhaust memory.
    maximum: float | None = None


DAY = 86400.0
YEAR = 365 * DAY
# Ranges of the numeric parameters the policy tables define (their defaults give the type).
RANGES: dict[str, tuple[float, float]] = {
    "annealing_iterations": (0, 100_000),
    "annealing_max_jobs": (0, 1_000),
    "annealing_t0": (0, 1_000),
    "fragmentation_penalty": (0, 1_000),
    "genetic_generations": (0, 10_000),
    "genetic_max_jobs": (0, 1_000),
    "genetic_mutation": (0, 1),
    "genetic_patience": (0, 10_000),
    "genetic_population": (0, 10_000),
    "ilp_max_bb_nodes": (0, 1_000_000),
    "ilp_max_jobs": (0, 100_000),
    "ilp_max_leaves": (0, 1_000_000),
    "ilp_max_nodes": (0, 10_000),
    "ilp_max_variables": (0, 50_000_000),
    "ilp_time_limit": (0, 600),
    "priority_max_age": (0, YEAR),
    "priority_reservation_after": (0, YEAR),
    "value_size_exponent": (0, 10),
}
# The rest, by kind: weights and counts.
DEFAULT_RANGES = {"int": (0.0, 1_000_000.0), "number": (0.0, 1e9)}
MAX_LIST_ITEMS = 64
MAX_RANK = 1_000


# Read by the cycle itself or shared by several policies.
COMMON: dict[str, Param] = {
    "fairshare_half_life": Param(
        "number",
        DEFAULT_HALF_LIFE,
        1.0,
        help="Seconds after which past usage counts half.",
        maximum=10 * YEAR,
    ),
    "preemption": Param("bool", True, help="A team under its guarantee reclaims GPUs."),
    "qos_preemption": Param("bool", False, help="A higher QoS preempts a lower one."),
    "qos_ranks": Param(
        "ranks",
        None,
        -MAX_RANK,
        help='QoS name -> rank, e.g. {"low": 0, "high": 2}.',
        maximum=MAX_RANK,
    ),
    "max_preemptions_per_cycle": Param(
        "int",
        32,
        0,
        help="Most jobs preempted in one cycle; those still stopping count against it.",
        maximum=10_000,
    ),
    "backfill_use_predictions": Param("bool", False, help="Reservations use predicted ends."),
    "backfill_order": Param("str", "priority", choices=("priority", "submit")),
    "las_queue_thresholds": Param(
        "numbers", None, 0.0, help="GPU-hours bounding LAS queues.", maximum=1e9
    ),
    "las_preemption": Param("bool", True),
    # What a preemption costs and when it pays (scheduler/core/preemption_cost.py,
    # docs/preemption.md); read by every policy's cycle.
    "preemption_restart_overhead": Param(
        "number", 60.0, 0.0, help="Seconds a preempted job spends restarting.", maximum=DAY
    ),
    "preemption_checkpoints": Param(
        "bool", False, help="Jobs resume from checkpoints (else a preempted job starts over)."
    ),
    "preemption_checkpoint_interval": Param(
        "number",
        0.0,
        0.0,
        help="Seconds between a job's checkpoints (0: continuous).",
        maximum=DAY,
    ),
    "preemption_max_per_job": Param(
        "int", 10, 0, help="Preemptions a job may suffer (0: no cap).", maximum=1_000
    ),
    "preemption_cost_weight": Param(
        "number",
        8.0,
        0.0,
        help="Times a preemption's lost GPU-time counts against its gain.",
        maximum=1e3,
    ),
    "preemption_loss_bound": Param(
        "number",
        16.0,
        0.0,
        help="gittins: most progress a preemption may throw away, in times the waiting "
        "job's expected remaining GPU-time (0: no bound).",
        maximum=1e6,
    ),
    "preemption_gain_check": Param(
        "bool", True, help="las and gittins preempt only when the expected gain beats the cost."
    ),
    "gittins_margin": Param(
        "number", 0.5, 0.0, help="Index advantage a waiting job needs to preempt.", maximum=1e3
    ),
    "gittins_min_slice": Param(
        "number", 300.0, 0.0, help="Seconds a job runs before it may be preempted.", maximum=DAY
    ),
    "gittins_use_limits": Param("bool", True, help="Job sizes scale with time limits."),
    "gittins_preemption": Param("bool", True),
    "tiresias_threshold": Param(
        "number", 16.0, 0.0, help="GPU-hours at which a job drops to the low queue.", maximum=1e6
    ),
    "tiresias_starve": Param(
        "number",
        10.0,
        0.0,
        help="Promote a waiting job after STARVE x its run time (0: never).",
        maximum=1e6,
    ),
    "tiresias_preemption": Param("bool", True),
    "tiresias_max_preemptions": Param(
        "int",
        0,
        0,
        help="Per-job preemption cap for tiresias (0: none, as published).",
        maximum=1_000,
    ),
    "gavel_min_speed": Param(
        "number",
        0.25,
        0.0,
        help="gavel starts a job only on GPU models that run it at this share of its best "
        "speed or more (0: any).",
        maximum=1.0,
    ),
    "seed": Param("int", 0, 0, help="Seed of the random search policies.", maximum=2**32 - 1),
    "prediction_history": Param(
        "int",
        5000,
        0,
        help="Finished jobs the runtime predictor learns from.",
        maximum=1_000_000,
    ),
    "eta_max_events": Param(
        "int", 100, 0, help="Job ends the ETA forecast plays forward.", maximum=100_000
    ),
    "eta_interval": Param(
        "number",
        60.0,
        0.0,
        help="Seconds between ETA forecasts (0: every cycle).",
        maximum=DAY,
    ),
    "eta_horizon": Param(
        "number", 30 * 86400.0, 0.0, help="Seconds the ETA forecast covers.", maximum=YEAR
    ),
    "placement": Param(
        "str",
        "fragmentation",
        choices=("fragmentation", "best_fit"),
        help="Where jobs go: least rise in fragmentation for the recent request mix, or "
        "plain best fit (docs/packing.md).",
    ),
}

# Policy modules whose defaults name the keys they read: (module, attribute, key prefix).
_DEFAULT_TABLES = (
    ("scheduler.policies.priority", "DEFAULTS", ""),
    ("scheduler.policies.packing._values", "DEFAULTS", ""),
    ("scheduler.policies.packing.ilp", "_DEFAULTS", ""),
    ("scheduler.policies.packing.genetic", "GeneticPolicy._defaults", "genetic_"),
    ("scheduler.policies.packing.annealing", "AnnealingPolicy._defaults", "annealing_"),
)


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "number"
    return "str"


def known_params() -> dict[str, Param]:
    """Every parameter a registered policy or the cycle reads, with its type and default."""
    params = dict(COMMON)
    for module_name, attr, prefix in _DEFAULT_TABLES:
        try:
            target: Any = import_module(module_name)
        except ImportError:  # a policy module not there yet: its keys are unknown
            continue
        for part in attr.split("."):
            target = getattr(target, part, None)
        if not isinstance(target, Mapping):
            continue
        for key, default in target.items():
            kind = _kind_of(default)
            name = f"{prefix}{key}"
            minimum = maximum = None
            if kind in ("int", "number"):
                minimum, maximum = RANGES.get(name, DEFAULT_RANGES[kind])
            params.setdefault(name, Param(kind, default, minimum, maximum=maximum))
    return params


def _type_error(key: str, value: Any, spec: Param) -> str | None:
    words = {
        "bool": "true or false",
        "int": "a whole number",
        "number": "a number",
        "str": "a string",
        "numbers": "a list of numbers",
        "ranks": "an object mapping QoS names to whole numbers",
    }
    shown = json.dumps(value)
    wrong = f"parameter {key} must be {words[spec.kind]}; got {shown}"
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if spec.kind == "bool" and not isinstance(value, bool):
        return wrong
    if spec.kind == "int" and not (is_number and float(value).is_integer()):
        return wrong
    if spec.kind == "number" and not is_number:
        return wrong
    if spec.kind == "str" and not isinstance(value, str):
        return wrong
    if spec.kind == "numbers":
        if not isinstance(value, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value
        ):
            return wrong
    if spec.kind == "ranks":
        if not isinstance(value, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value.values()
        ):
            return wrong
    if spec.choices and value not in spec.choices:
        return f"parameter {key} must be one of {', '.join(spec.choices)}; got {shown}"
    if spec.kind in ("numbers", "ranks") and len(value) > MAX_LIST_ITEMS:
        return f"parameter {key} takes at most {MAX_LIST_ITEMS} entries; got {len(value)}"
    if spec.kind == "numbers":
        values = value
    elif spec.kind == "ranks":
        values = list(value.values())
    else:
        values = [value] if is_number else []
    low = -math.inf if spec.minimum is None else spec.minimum
    high = math.inf if spec.maximum is None else spec.maximum
    if any(not low <= v <= high for v in values):
        if spec.maximum is None:
            return f"parameter {key} must be at least {_number(low)}; got {shown}"
        return (
            f"parameter {key} must be at least {_number(low)} and at most {_number(high)}; "
            f"got {shown}"
        )
    return None


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def validate_params(params: Any) -> dict[str, Any]:
    """The parameters as given, or ApplicationError naming each bad key."""
    if not isinstance(params, dict):
        raise ApplicationError(
            "params must be an object mapping parameter names to values.",
            {"fields": {"params": ["Give an object."]}},
        )
    known = known_params()
    errors: list[str] = []
    for key, value in params.items():
        spec = known.get(key)
        if spec is None:
            errors.append(f"unknown parameter {key}; known: {', '.join(sorted(known))}")
            continue
        if value is None:  # null resets a parameter to the policy's default
            continue
        error = _type_error(key, value, spec)
        if error is not None:
            errors.append(error)
    if errors:
        raise ApplicationError(
            "Invalid scheduler parameters: " + "; ".join(errors) + ".",
            {"fields": {"params": errors}},
        )
    return {k: v for k, v in params.items() if v is not None}
