"""The Gittins policies sort their queue with numpy (`queue_order`) exactly as sorting by
the tuple of keys, submit time and id would, ties and NaN included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.policies.gittins import queue_order
from tests.scheduler.core.builders import job, snap

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
