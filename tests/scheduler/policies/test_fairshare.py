from typing import Any

from scheduler.core.model import RunningJob
from scheduler.core.usage import decay_usage
from scheduler.policies import get_policy
from tests.scheduler.core.builders import job, node, placed, running, snap, team

DAY = 86400.0
HALF_LIFE = 3600.0


def _simulate_day(weights: dict[str, float]) -> dict[str, float]:
    """Two teams keep 6 one-GPU jobs queued on a 4-GPU node; returns GPU-seconds per team."""
    policy = get_policy("fairshare")
    usage = dict.fromkeys(weights, 0.0)
    served = dict.fromkeys(weights, 0.0)
    runs: list[RunningJob] = []
    queued: dict[str, list[Any]] = {t: [] for t in weights}
    ids = iter(range(1, 1_000_000))
    now = 0.0
    while now < DAY:
        for t in weights:
            while len(queued[t]) < 6:
                i = next(ids)
                queued[t].append(job(i, 1, team=t, submitted=now, limit=300 + (i * 37) % 900))
        teams = [team(t, fairshare_weight=w, decayed_usage=usage[t]) for t, w in weights.items()]
        pending = [j for t in weights for j in queued[t]]
        s = snap([node("a", 4)], pending, runs, teams=teams, now=now)
        by_id = {j.id: j for j in pending}
        for job_id, (node_name, gpus) in placed(policy.schedule(s)).items():
            j = by_id[job_id]
            queued[j.team].remove(j)
            runs.append(
                running(j.id, node_name, gpus, team=j.team, started=now, limit=j.time_limit)
            )
        nxt = min(r.limit_end for r in runs)
        used = dict.fromkeys(weights, 0.0)
        for r in runs:
            used[r.team] += nxt - now
        for t in weights:
            usage[t] = decay_usage(usage[t], used[t], nxt - now, HALF_LIFE)
            served[t] += used[t]
        runs = [r for r in runs if r.limit_end > nxt]
        now = nxt
    return served


def test_gpu_time_converges_to_the_fairshare_weights():
    served = _simulate_day({"a": 2.0, "b": 1.0})
    ratio = served["a"] / served["b"]
    assert abs(ratio - 2.0) / 2.0 < 0.15, ratio
    assert sum(served.values()) > 0.95 * 4 * DAY  # and the node stayed busy


def test_within_a_cycle_gpus_alternate_towards_the_weights():
    teams = [team("a", fairshare_weight=1.0), team("b", fairshare_weight=1.0)]
    pending = [job(i, 1, team="a") for i in range(1, 5)] + [
        job(i, 1, team="b") for i in range(5, 9)
    ]
    plan = get_policy("fairshare").schedule(snap([node("n", 4)], pending, teams=teams))
    assert sorted(placed(plan)) == [1, 2, 5, 6]
