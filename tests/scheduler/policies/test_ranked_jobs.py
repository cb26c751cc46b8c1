"""RankedJobs, the queue in order read from the rows' job column as the walk reaches it,
reads as the list it stands for, whatever the order of reads."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.policies.job_rows import RankedJobs

# A read: ("item", position) or ("slice", start, stop), positions in 0..1 of the length.
reads = st.lists(
    st.one_of(
        st.tuples(st.just("item"), st.floats(-1, 0.999)),
        st.tuples(st.just("slice"), st.floats(0, 1), st.floats(0, 1)),
        st.tuples(st.just("iter"), st.just(0.0)),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 1500),
    seed=st.integers(0, 2**16),
    steps=reads,
    nested=st.booleans(),
)
def test_reads_as_the_list_it_stands_for(n, seed, steps, nested) -> None:
    rng = np.random.default_rng(seed)
    column = np.empty(n + 3, object)
    column[:] = [f"job{i}" for i in range(n + 3)]
    ids = np.arange(n + 3, dtype=float) * 7  # (the rows keep ids in float columns)
    rows = rng.permutation(n + 3)[:n]
    expected = column[rows].tolist()
    expected_ids = [int(i) * 7 for i in rows]
    seq = RankedJobs(column, rows, ids)
    if nested and n:
        seq, expected = seq[n // 3 :], expected[n // 3 :]  # a slice read as a whole again
        expected_ids = expected_ids[n // 3 :]
        n = len(expected)
    assert len(seq) == n
    assert seq.job_ids() == expected_ids
    for step in steps:
        if step[0] == "item" and n:
            k = int(step[1] * n)  # negative positions count from the end
            assert seq[k] == expected[k]
        elif step[0] == "slice":
            a, b = sorted((int(step[1] * n), int(step[2] * n)))
            assert list(seq[a:b]) == expected[a:b]
            assert list(seq[a:]) == expected[a:]
        elif step[0] == "iter":
            assert list(seq) == expected
    assert list(seq) == expected
    assert list(seq[::2]) == expected[::2]


def test_out_of_range_is_an_index_error() -> None:
    column = np.array(["a", "b", "c"], object)
    seq = RankedJobs(column, np.array([2, 0]), np.zeros(3))
    for k in (2, -3, 10):
        try:
            seq[k]
        except IndexError:
            continue
        raise AssertionError(f"position {k} read")
