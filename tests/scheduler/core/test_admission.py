from scheduler.core.admission import admission_error
from tests.scheduler.core.builders import frac, job, node, team

NODES = (node("a", 8), node("v", 4, "V100", 16384))


def test_more_gpus_than_any_node():
    assert admission_error(job(1, 16), NODES, None) == (
        "needs 16 GPUs on one node; the largest node has 8"
    )
    assert admission_error(job(1, 8), NODES, None) is None
    assert "the largest node has 4" in admission_error(job(1, 8, gpu_model="V100"), NODES, None)


def test_unknown_model_lists_the_models():
    assert admission_error(job(1, 1, gpu_model="H100"), NODES, None) == (
        "no node has H100 GPUs; the fleet has A100, V100"
    )


def test_fraction_over_the_largest_gpu_memory():
    assert admission_error(frac(1, 100_000, 20), NODES, None) == (
        "asks for 100000 MB of one GPU; the largest GPU has 81920 MB"
    )
    assert admission_error(frac(1, 20_000, 20, gpu_model="V100"), NODES, None) == (
        "asks for 20000 MB of one V100 GPU; the largest V100 GPU has 16384 MB"
    )
    assert admission_error(frac(1, 1000, 0), NODES, None).startswith("asks for 0 %")


def test_min_memory_over_every_gpu():
    message = admission_error(job(1, 1, min_gpu_memory_mb=100_000), NODES, None)
    assert message == "needs a GPU with at least 100000 MB; the largest GPU has 81920 MB"


def test_over_team_hard_limit_or_user_cap():
    assert admission_error(job(1, 4), NODES, team("t", hard_limit_gpus=2)) == (
        "needs 4 GPUs; team t's hard limit is 2"
    )
    assert "per-user cap in team t is 3" in admission_error(
        job(1, 4), NODES, team("t", user_gpu_cap=3)
    )
    assert admission_error(job(1, 2), NODES, team("t", hard_limit_gpus=2)) is None
