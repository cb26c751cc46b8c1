"""Where and when a job that does not fit now could start, from the ends of the jobs in
the way: the shadow time of EASY backfill.

Ends come from running jobs (time limit, or prediction when the policy says so), from
jobs placed earlier in the same cycle and from the holds of attempts still stopping
(`Snapshot.holds`, until they expire at the latest). With time limits the answer is a promise the
fleet can keep, since a job is stopped at its limit; with predictions it is a guess.

A multi-node gang (and a one-node job asking for host CPUs or memory on a fleet that
reports them) is swept with `earliest_start_members`: GPU and host releases in time order,
until enough distinct nodes each hold a member.

The package: `occupants` (what holds GPUs until when), `sweep` (the plain search over a
list of occupants), `members` (the sweep for gangs and host-bound jobs), `timeline` (the
release timeline kept across cycles, and the search that walks it).
"""

from scheduler.core.reservation.members import earliest_start_members, kind_eligibility
from scheduler.core.reservation.occupants import (
    Occupant,
    occupant_of,
    occupants_of,
    running_occupants,
)
from scheduler.core.reservation.sweep import earliest_start
from scheduler.core.reservation.timeline import ReleaseTimeline, earliest_start_running

__all__ = [
    "Occupant",
    "ReleaseTimeline",
    "earliest_start",
    "earliest_start_members",
    "earliest_start_running",
    "kind_eligibility",
    "occupant_of",
    "occupants_of",
    "running_occupants",
]
