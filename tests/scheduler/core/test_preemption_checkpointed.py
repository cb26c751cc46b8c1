"""A running job known to checkpoint (or known not to) is costed so, whatever the setting."""

from dataclasses import replace

from scheduler.core.preemption_cost import PreemptionCost
from scheduler.policies import get_policy
from tests.scheduler.core.builders import job, node, running, snap, team

HOUR = 3600.0


def test_a_job_known_to_checkpoint_loses_only_the_time_since_its_last_one() -> None:
    victim = running(1, "a", (0, 1), started=0.0)
    says_yes = replace(victim, checkpointed=True)
    says_no = replace(victim, checkpointed=False)
    # Setting: no checkpoints, or checkpoints every 10 minutes.
    plain = PreemptionCost(restart_overhead=60.0, checkpoint_interval=600.0)
    assert plain.lost_seconds(victim, 1000.0) == 1000.0  # unknown: the setting
    assert plain.lost_seconds(says_yes, 1000.0) == 400.0
    assert plain.gpu_seconds(says_yes, 1000.0) == 2 * 460.0
    assert "7 min since its last checkpoint" in plain.explain(says_yes, 1000.0)
    assert plain.lost_seconds(says_no, 1000.0) == 1000.0
    every_10_min = replace(plain, checkpoints=True)
    assert every_10_min.lost_seconds(victim, 1000.0) == 400.0
    assert every_10_min.lost_seconds(says_no, 1000.0) == 1000.0
    assert "without a checkpoint" in every_10_min.explain(says_no, 1000.0)
    assert every_10_min.lost_seconds(says_yes, 1000.0) == 400.0


def _las(run, **settings):
    return get_policy("las").schedule(
        snap([node("a", 1)], [job(1, submitted=100.0)], run, settings=settings, now=2 * HOUR)
    )


def test_the_gain_check_reads_whether_the_victim_checkpoints() -> None:
    # The victim ran 2 h (las queue 2), the waiting job is fresh. Without a checkpoint the
    # restart throws away 2 h: it does not pay (test_preemption). Known to checkpoint, only
    # the restart is lost and it pays, whatever the setting says of the others.
    victim = running(7, "a", (0,), started=0.0)
    assert _las([victim]).preempts == ()
    assert [p.job_id for p in _las([replace(victim, checkpointed=True)]).preempts] == [7]
    # Known not to checkpoint, the setting that jobs do is not believed for it.
    assert _las([replace(victim, checkpointed=False)], preemption_checkpoints=True).preempts == ()
    assert [p.job_id for p in _las([victim], preemption_checkpoints=True).preempts] == [7]


def test_victims_known_to_checkpoint_are_the_cheaper_ones() -> None:
    # Two borrowers ran as long; the one that checkpoints loses nothing but its restart.
    run = [
        running(1, "a", (0,), team="big", started=0.0),
        running(2, "a", (1,), team="big", started=0.0, checkpointed=True),
    ]
    teams = [team("lab", guaranteed_gpus=1), team("big")]
    s = snap([node("a", 2)], [job(10, team="lab")], run, teams=teams, now=HOUR)
    plan = get_policy("priority").schedule(s)
    assert [p.job_id for p in plan.preempts] == [2]
