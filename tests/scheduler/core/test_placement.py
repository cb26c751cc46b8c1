from scheduler.core.placement import FreeCapacity
from tests.scheduler.core.builders import frac, job, node, running, snap


def test_gang_goes_where_it_fills_the_free_block_and_keeps_whole_nodes_free():
    s = snap([node("a"), node("b")], running_jobs=[running(1, "b", (0, 1, 2, 3, 4, 5))])
    cap = FreeCapacity.from_snapshot(s)
    assert cap.best_fit(job(10, 2)) == ("b", (6, 7))
    assert cap.best_fit(job(11, 4)) == ("a", (0, 1, 2, 3))
    assert cap.largest_free_block() == (8, "a")
    assert cap.free_gpus_total() == 10


def test_fractions_share_one_gpu_by_memory_and_compute():
    cap = FreeCapacity.from_snapshot(snap([node("a", 2)]))
    spots = []
    for i in range(5):
        small = frac(i, 10_000, 25)
        choice = cap.best_fit(small)
        cap.take(small, *choice)
        spots.append(choice)
    # Four quarters fill GPU 0's compute; the fifth needs another GPU.
    assert spots[:4] == [("a", (0,))] * 4
    assert spots[4] == ("a", (1,))
    assert cap.free_on("a", 0) == (81920 - 40_000, 0)


def test_fraction_memory_limits_sharing():
    cap = FreeCapacity.from_snapshot(snap([node("a", 2)]))
    big = frac(1, 50_000, 10)
    cap.take(big, *cap.best_fit(big))
    assert cap.best_fit(frac(2, 50_000, 10)) == ("a", (1,))
    assert cap.best_fit(frac(3, 30_000, 10)) == ("a", (0,))


def test_a_gang_never_takes_a_partly_used_gpu():
    s = snap(
        [node("a", 2)],
        running_jobs=[running(1, "a", (0,), gpus=0, gpu_memory_mb=1000, gpu_compute_percent=10)],
    )
    cap = FreeCapacity.from_snapshot(s)
    assert cap.best_fit(job(2, 2)) is None
    assert cap.best_fit(job(3, 1)) == ("a", (1,))


def test_model_and_min_memory_constraints():
    s = snap([node("v", 8, "V100", 16384), node("a", 2)])
    cap = FreeCapacity.from_snapshot(s)
    assert cap.best_fit(job(1, 1, gpu_model="V100"))[0] == "v"
    assert cap.best_fit(job(2, 4, min_gpu_memory_mb=40_000)) is None
    assert cap.best_fit(job(3, 2, min_gpu_memory_mb=40_000)) == ("a", (0, 1))
    assert cap.best_fit(job(4, 1, gpu_model="H100")) is None
    assert cap.best_fit(frac(5, 20_000, 10))[0] == "a"  # a V100 has only 16 GB
    assert not cap.eligible(job(6, 1, gpu_model="A100"), "v", 0)
    assert cap.eligible(job(6, 1, gpu_model="A100"), "a", 1)


def test_unschedulable_nodes_are_not_offered():
    cap = FreeCapacity.from_snapshot(snap([node("d", schedulable=False), node("a", 1)]))
    assert cap.best_fit(job(1, 2)) is None
    assert cap.free_gpus_total() == 1


def test_release_undoes_take_and_forgets_failed_shapes():
    cap = FreeCapacity.from_snapshot(snap([node("a", 2)]))
    first = job(1, 2)
    cap.take(first, "a", (0, 1))
    assert cap.best_fit(job(2, 2)) is None
    cap.release(first, "a", (0, 1))
    assert cap.best_fit(job(2, 2)) == ("a", (0, 1))


def test_candidates_list_every_feasible_choice_best_first():
    s = snap([node("a", 4), node("b", 2)], running_jobs=[running(1, "a", (0,))])
    cap = FreeCapacity.from_snapshot(s)
    assert cap.candidates(job(2, 2)) == [("b", (0, 1)), ("a", (1, 2))]
    assert cap.candidates(job(3, 4)) == []
    assert len(cap.candidates(frac(4, 1000, 5))) == 5
    assert cap.fits(job(2, 2), "a", (2, 3))
    assert not cap.fits(job(2, 2), "a", (0, 1))
