"""The Gittins policies sort their queue with numpy (`queue_order`) exactly as sorting by
the tuple of keys, submit time and id would, ties and NaN included; and compute the
indices they sort by as columns, exactly as job by job."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.service_distribution import ServiceDistribution
from scheduler.policies.gittins import RATIO_STEPS, queue_order
from tests.scheduler.core.builders import job, node, snap
from tests.scheduler.policies.test_gittins_hint import _cycle_of

VALUES = st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, 1e-300, float("nan"), float("inf")])


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(VALUES, VALUES, st.sampled_from([0.0, 5.0, 7.0, float("nan")])),
        min_size=0,
        max_size=30,
    ),
    ids=st.permutations(range(30)),
)
def test_queue_order_sorts_as_the_tuples_do(rows, ids) -> None:
    jobs = [job(1000 + ids[k], 1, submitted=s) for k, (_, _, s) in enumerate(rows)]
    snapshot = snap([], jobs)
    first = np.array([r[0] for r in rows], float)
    second = np.array([r[1] for r in rows], float)
    got = [j.id for j in queue_order(snapshot, (first, second))[0]]
    # (new float objects, as the policy's keys are: a NaN equals itself only as one object)
    key = {
        j.id: (first[k].item(), second[k].item(), j.submitted_at, j.id) for k, j in enumerate(jobs)
    }
    want = [j.id for j in sorted(snapshot.pending, key=lambda j: key[j.id])]
    assert got == want


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from([0.0, 100.0, 3_599.0, 3_600.0, 7_200.0, 1e5, 12_345.678]),
            st.sampled_from([60.0, 3_600.0, 86_400.0]),
            st.sampled_from([1, 2, 8, 0]),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_indices_by_columns_are_the_ratio_index_job_by_job(rows) -> None:
    """The queue's Gittins indices, computed by columns, are what the documented formula
    gives job by job: 1 at the limit, else the ratio distribution's index at the attained
    share of limit x GPUs rounded down to 1/64ths, over limit x GPUs."""
    ratios = tuple(k / 20 for k in range(1, 21))
    jobs = [
        job(k + 1, gpus, attained_service=attained, limit=limit, gpu_compute_percent=30,
            gpu_memory_mb=1024)
        for k, (attained, limit, gpus) in enumerate(rows)
    ]  # fmt: skip
    snapshot = replace(
        snap([node("a", 8)], jobs, settings={"gittins_preemption": False}),
        limit_ratio_distribution=ratios,
    )
    cycle = _cycle_of("gittins", snapshot)
    dist = ServiceDistribution(ratios)
    for j in jobs:
        cap = j.time_limit * j.gpu_equivalent
        want = (
            1.0
            if j.attained_service >= cap
            else dist.index(math.floor(j.attained_service / cap * RATIO_STEPS) / RATIO_STEPS) / cap
        )
        assert cycle.rule_key(j) == want
