"""What the queue-ordering policies share: walk pending jobs in the policy's order, place
each by best fit within quotas, and say why every other job waits.

A policy is then mostly an order plus flags:

- `blocking`: the first job that finds no room stops everything behind it (fcfs);
- `reserve`: the first job that finds no room (or the first the predicate accepts) gets
  a reservation, and later jobs may only use the reserved GPUs if they end before it
  starts (EASY backfill);
- `preempt`: a job that finds no room may preempt running jobs: a team within its
  guarantee reclaims GPUs from borrowing teams (settings "preemption", default on), a
  higher QoS preempts a lower one (settings "qos_preemption", default off), and the
  policy may add its own rule (least attained service).

A multi-node gang is placed whole or not at all (FreeCapacity.best_fit_members); its
reservation and its preemptions span every node it needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any

from scheduler.core.admission import FleetProfile
from scheduler.core.model import (
    Member,
    PendingJob,
    Place,
    Plan,
    Preempt,
    Reserve,
    RunningJob,
    Snapshot,
)
from scheduler.core.placement import Choice, FreeCapacity, Members
from scheduler.core.preemption_cost import PreemptionCost
from scheduler.core.quota import QuotaLedger
from scheduler.core.reservation import (
    earliest_start_members,
    earliest_start_running,
    occupant_of,
    occupants_of,
    running_occupants,
)
from scheduler.policies.cycle_parts import HeldReservation
from scheduler.policies.cycle_preempt import CyclePreemption, RuleHint, VictimFilter, VictimRule
from scheduler.policies.cycle_waits import CycleWaits
from scheduler.policies.walk import QueueWalk

_job_id = attrgetter("id")


class Cycle(QueueWalk, CyclePreemption, CycleWaits):
    """One scheduling cycle over a snapshot; call `consider` per job in order, then `plan`."""

    def __init__(
        self,
        snapshot: Snapshot,
        policy: str,
        *,
        blocking: bool = False,
        reserve: bool | Callable[[PendingJob], bool] = False,
        reserve_with_predictions: bool = False,
        preempt: bool = True,
        victim_rule: VictimRule | None = None,
        rule_key: Callable[[PendingJob], Any] | None = None,
        victim_filter: VictimFilter | None = None,
        rule_hint: RuleHint | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.now = snapshot.now
        self.policy = policy
        self.settings = snapshot.settings
        # settings["fast_paths"] false: no shortcuts (the reference the tests and benches
        # compare the shortcuts against).
        self.fast = bool(self.settings.get("fast_paths", True))
        self.cap = FreeCapacity.from_snapshot(snapshot)
        self.quota = QuotaLedger.from_snapshot(snapshot, carried=self.fast)
        self.blocking = blocking
        self.reserve_rule = reserve
        self.reserve_with_predictions = reserve_with_predictions
        self.preempt = preempt
        self.victim_rule = victim_rule
        # What, beyond shape, team and QoS, decides which victims victim_rule allows.
        self.rule_key = rule_key
        # Positions, in the preemptible list, of every victim victim_rule may allow (more is
        # fine, never fewer): the rule is asked about those only.
        self.victim_filter = victim_filter
        # Per job of a queue, whether victim_rule may allow it any victim (more is fine,
        # never fewer): the walk passes over the others once they cannot start.
        self.rule_hint = rule_hint
        self.places: list[Place] = []
        self.preempts: list[Preempt] = []
        self.reserves: list[Reserve] = []
        self.notes: list[str] = []
        self.order: list[int] = []
        # The jobs of `order` (in full from runs only where the plan explains: explain and
        # plan_waits on).
        self._walked: list[PendingJob] = []
        self._room_runs: list[tuple[int, int, bool]] = []
        self._rewaited = False  # `wait` gave a job walked before its own reason
        self._seen: set[int] = set()
        self._unmarked: list[Sequence[PendingJob]] = []  # seen, not yet in _seen
        self._waits: dict[int, tuple[PendingJob, str, Any]] = {}
        # Occupants besides the running jobs: the holds of stopping attempts, then this
        # cycle's placements (the reservation search reads when each comes back).
        self._placed: list = list(snapshot.holds)
        self._preempted: set[int] = set()
        self._reservation: HeldReservation | None = None
        self._blocked_by: int | None = None
        self._preempt_fails: set[tuple[Any, ...]] = set()
        self._profile: FleetProfile | None = None
        self._fleet_errors: dict[tuple[Any, ...], str | None] = {}  # by _fleet_request
        # What a preemption costs, and the per-job cap: a job preempted that often already
        # is no longer a victim (scheduler/core/preemption_cost.py).
        self.costs = PreemptionCost.from_settings(self.settings)
        self._victims: list[RunningJob] | None = None  # preemptible, below the cap
        self._team_positions: dict[str, list[int]] | None = None  # of each team in _victims
        self._victim_costs: dict[int, tuple[RunningJob, float, float]] = {}
        self._reclaim_on = bool(self.settings.get("preemption", True))
        self._qos_on = bool(self.settings.get("qos_preemption", False))
        self._max_preempts = max(
            0,
            int(self.settings.get("max_preemptions_per_cycle", 32)) - snapshot.preemptions_stopping,
        )
        # settings["explain"] false (the simulator): waits carry no sentence, which saves
        # building one per waiting job; decisions are the same.
        self.explain = bool(self.settings.get("explain", True))
        # settings["plan_waits"] false (the simulator, which applies only places, preempts
        # and reserves): the plan carries no Waits and its order stops where the walk
        # settled. Production cycles keep the default: every pending job in order, waiting.
        self.full_plan = bool(self.settings.get("plan_waits", True))

    # -- walking the queue -------------------------------------------------------------

    def consider(self, job: PendingJob) -> bool:
        """Try to start the job now; True when placed. Records its wait otherwise."""
        if self._unmarked:
            self._mark_seen()
        if job.id in self._seen:
            return False
        self._seen.add(job.id)
        self.order.append(job.id)
        self._walked.append(job)
        if self._blocked_by is not None:
            self._waits[job.id] = (job, "blocked", self._blocked_by)
            return False
        limit = self.quota.check(job)
        if limit is not None:
            self._waits[job.id] = (job, "quota", limit)
            return False
        if job.gpus_per_node and job.gpus > job.gpus_per_node:
            return self._consider_gang(job)
        choice = self.cap.best_fit(job)
        held = self._reservation
        if choice is None and held is not None and self.now + job.time_limit <= held.start:
            choice = held.fit_inside(self.cap, job)
            if choice is not None:
                self._book(job, choice, f"backfilled: ends before job {held.job_id}'s reservation")
                return True
        if choice is not None:
            reason = f"backfilled beside job {held.job_id}'s reservation" if held else ""
            self.cap.take(job, *choice)
            self._book(job, choice, reason)
            return True
        self._on_no_room(job)
        return False

    def _consider_gang(self, job: PendingJob) -> bool:
        """A multi-node gang: every member now, or none (it does not backfill inside a
        reservation: its nodes would all have to be the reserved ones)."""
        members = self.cap.best_fit_members(job)
        if members is None:
            self._on_no_room(job)
            return False
        held = self._reservation
        reason = f"backfilled beside job {held.job_id}'s reservation" if held else ""
        self.cap.take_members(job, members)
        self._book_members(job, members, reason)
        return True

    def _book(self, job: PendingJob, choice: Choice, reason: str) -> None:
        node, indices = choice
        self.quota.take(job)
        self.places.append(Place(job.id, node, indices, reason))
        self._placed.append(occupant_of(job, node, indices, self.now + job.time_limit))

    def _book_members(self, job: PendingJob, members: Members, reason: str) -> None:
        first = members[0]
        self.quota.take(job)
        self.places.append(Place(job.id, first.node, first.gpu_indices, reason, members[1:]))
        self._placed.extend(occupants_of(job, members, self.now + job.time_limit))

    def _on_no_room(self, job: PendingJob) -> None:
        self._waits[job.id] = (job, "resources", None)
        if self.preempt and self.try_preempt(job):
            pass
        elif self._reservation is None and self._wants_reservation(job):
            self.reserve(job)
        if self.blocking:
            self._blocked_by = job.id

    def _wants_reservation(self, job: PendingJob) -> bool:
        rule = self.reserve_rule
        return rule(job) if callable(rule) else bool(rule)

    def wait(self, job: PendingJob, reason: str) -> None:
        """Record a job the policy holds back for its own reason."""
        if self._unmarked:
            self._mark_seen()
        if job.id not in self._seen:
            self._seen.add(job.id)
            self.order.append(job.id)
            self._walked.append(job)
        else:
            self._rewaited = True
        self._waits[job.id] = (job, "text", reason)

    # -- reservations (preemption: CyclePreemption) ------------------------------------------------------

    def reserve(self, job: PendingJob) -> Reserve | None:
        """Reserve the earliest start for the job (EASY's shadow time), holding its GPUs."""
        members: Members
        if job.gpus_per_node and job.gpus > job.gpus_per_node:
            occupants = running_occupants(
                self.snapshot.running, use_predictions=self.reserve_with_predictions
            )
            spread = earliest_start_members(job, self.cap, occupants + self._placed, self.now)
            if spread is None:
                return None
            start, members = spread
        else:
            found = earliest_start_running(
                job,
                self.cap,
                self.snapshot.running,
                self._placed,
                self.now,
                use_predictions=self.reserve_with_predictions,
                incremental=self.fast,
                running_changes=self.snapshot.running_changes,
            )
            if found is None:
                return None
            node, start, indices = found
            members = (Member(node, indices),)
        first, rest = members[0], members[1:]
        reservation = Reserve(job.id, first.node, start, first.gpu_indices, rest)
        self.reserves.append(reservation)
        self._reservation = HeldReservation(
            job.id,
            first.node,
            start,
            first.gpu_indices,
            cache=self.fast,
            members=rest,
            host=(job.cpus, job.memory_mb),
        )
        self._reservation.hold(self.cap)
        self._waits[job.id] = (job, "reserved", reservation)
        return reservation

    # -- the plan ---------------------------------------------------------------------------

    def plan(self, extra_notes: Iterable[str] = ()) -> Plan:
        """The decisions, with a Wait for every pending job not placed (settings
        "plan_waits" false: the decisions and the order walked, no Waits)."""
        if not self.full_plan:
            return Plan(
                policy=self.policy,
                places=tuple(self.places),
                preempts=tuple(self.preempts),
                reserves=tuple(self.reserves),
                waits=(),
                order=tuple(self.order),
                notes=tuple(self.notes) + tuple(extra_notes),
            )
        placed = {p.job_id for p in self.places}
        pending = self.snapshot.pending
        # (usually the walk saw every pending job: then no job needs looking at here)
        if not self._seen.issuperset(map(_job_id, pending)):
            for job in pending:
                if job.id not in self._seen and job.id not in placed:
                    self.wait(job, f"not considered by policy {self.policy}")
        waits = self._explained_waits(placed) if self.explain else self._quiet_waits(placed)
        return Plan(
            policy=self.policy,
            places=tuple(self.places),
            preempts=tuple(self.preempts),
            reserves=tuple(self.reserves),
            waits=tuple(waits),
            order=tuple(self.order),
            notes=tuple(self.notes) + tuple(extra_notes),
        )


def cycle_may_preempt(settings: Mapping[str, Any], guarantees: bool) -> bool:
    """Whether a Cycle with the policy's "preemption" flag could preempt at all under these
    settings: a team within its guarantee reclaims (needs `guarantees`: some team has
    one, or some job asks for no GPU share), or a higher QoS preempts a lower one."""
    if not settings.get("preemption", True):
        return False
    return guarantees or bool(settings.get("qos_preemption", False))


def run_ordered(
    snapshot: Snapshot, policy: str, ordered: Iterable[PendingJob], **flags: Any
) -> Plan:
    """Consider the jobs in this order with the given Cycle flags and return the plan."""
    cycle = Cycle(snapshot, policy, **flags)
    cycle.consider_all(list(ordered))
    return cycle.plan()
