"""The invariant checker itself catches broken plans (so the property tests can fail)."""

from scheduler.core.model import Place, Plan, Preempt, Wait
from tests.scheduler.core.builders import frac, job, node, running, snap, team
from tests.scheduler.invariants import plan_violations

S = snap(
    [node("a", 2), node("v", 1, "V100", 16384)],
    [job(1, 2), frac(2, 60_000, 60), frac(3, 30_000, 60), job(4, 1, gpu_model="V100")],
    [running(9, "v", (0,), preemptible=False)],
    teams=[team("t", hard_limit_gpus=3)],
)


def _plan(places=(), waits=(), preempts=()):
    listed = {p.job_id for p in places} | {w.job_id for w in waits}
    rest = tuple(Wait(j.id, "waits") for j in S.pending if j.id not in listed)
    return Plan(
        "x",
        places=tuple(places),
        waits=tuple(waits) + rest,
        preempts=tuple(preempts),
        order=tuple(j.id for j in S.pending),
    )


def test_a_sound_plan_passes():
    assert plan_violations(S, _plan([Place(1, "a", (0, 1))])) == []


def test_each_broken_rule_is_reported():
    cases = {
        "over-committed": [Place(2, "a", (0,)), Place(3, "a", (0,))],
        "needs 2 GPUs": [Place(1, "a", (0,))],
        "wants V100": [Place(4, "a", (0,))],
        "busy GPU": [Place(4, "v", (0,))],
        "shared by a whole-GPU job": [Place(1, "a", (0, 1)), Place(3, "a", (1,))],
        "hard limit": [Place(1, "a", (0, 1)), Place(2, "a", (0,))],
    }
    for expected, places in cases.items():
        problems = plan_violations(S, _plan(places))
        assert any(expected in p for p in problems), (expected, problems)
    assert any(
        "neither placed nor waiting" in p
        for p in plan_violations(S, Plan("x", order=tuple(j.id for j in S.pending)))
    )
    assert any(
        "not preemptible" in p for p in plan_violations(S, _plan(preempts=[Preempt(9, "r")]))
    )
