"""Scheduling policies: pure classes turning a `Snapshot` into a `Plan`.

A policy has a `name`, takes keyword parameters (`seed` where it is random) and offers
`schedule(snapshot) -> Plan`. Policies are imported lazily, so asking for `fcfs` never
loads the solver behind `ilp`.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any, Protocol

from scheduler.core.model import Plan, Snapshot


class Policy(Protocol):
    name: str

    def schedule(self, snapshot: Snapshot) -> Plan: ...


POLICIES: dict[str, str] = {
    "fcfs": "scheduler.policies.fcfs:FcfsPolicy",
    "priority": "scheduler.policies.priority:PriorityPolicy",
    "sjf": "scheduler.policies.sjf:SjfPolicy",
    "fairshare": "scheduler.policies.fairshare:FairsharePolicy",
    "backfill": "scheduler.policies.backfill:BackfillPolicy",
    "las": "scheduler.policies.las:LasPolicy",
    "gittins": "scheduler.policies.gittins:GittinsPolicy",
    "gittins-tiers": "scheduler.policies.gittins_tiers:GittinsTiersPolicy",
    "tiresias": "scheduler.policies.tiresias:TiresiasPolicy",
    "gavel": "scheduler.policies.gavel:GavelPolicy",
    "greedy": "scheduler.policies.packing.greedy:GreedyPolicy",
    "ilp": "scheduler.policies.packing.ilp:IlpPolicy",
    "genetic": "scheduler.policies.packing.genetic:GeneticPolicy",
    "annealing": "scheduler.policies.packing.annealing:AnnealingPolicy",
}


def policy_names() -> list[str]:
    return list(POLICIES)


def policy_class(name: str) -> type:
    """The class behind a policy name; KeyError names the known ones."""
    try:
        target = POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    module_name, _, class_name = target.partition(":")
    return getattr(import_module(module_name), class_name)


def get_policy(name: str, **params: Any) -> Policy:
    """A new policy object, built with the given keyword parameters."""
    return policy_class(name)(**params)
