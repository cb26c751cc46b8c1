"""MIG devices are GPUs of their own (docs/mig.md), but a CUDA process uses only one: a job
that needs several GPUs on one node never lands on MIG devices, and admission refuses one
that could only run there. One GPU per node, a fraction, or a gang of one GPU per node may
use them."""

from __future__ import annotations

from scheduler.core.admission import admission_error
from scheduler.policies import get_policy
from tests.scheduler.core.builders import frac, job, node, placed, snap

MIG = "A100-80GB MIG 3g.40gb"


def mig_node(name: str) -> object:
    return node(name, 2, MIG, 40960)


def test_several_gpus_on_one_node_go_to_whole_gpus_not_to_mig_devices() -> None:
    nodes = (mig_node("m1"), node("w1", 2, "A100-80GB"))
    plan = get_policy("fcfs").schedule(snap(nodes, [job(1, 2)]))
    assert placed(plan) == {1: ("w1", (0, 1))}


def test_with_only_mig_devices_free_a_two_gpu_job_waits() -> None:
    plan = get_policy("fcfs").schedule(snap((mig_node("m1"), mig_node("m2")), [job(1, 2)]))
    assert placed(plan) == {}


def test_one_gpu_a_fraction_and_a_one_per_node_gang_may_use_mig_devices() -> None:
    plan = get_policy("fcfs").schedule(snap((mig_node("m1"),), [job(1, 1), frac(2, 8192, 30)]))
    assert set(placed(plan)) == {1, 2}
    gang = job(3, 2, gpus_per_node=1)
    plan = get_policy("fcfs").schedule(snap((mig_node("m1"), mig_node("m2")), [gang]))
    (place,) = plan.places
    assert {place.node, *(m.node for m in place.members)} == {"m1", "m2"}


def test_admission_refuses_several_mig_devices_on_one_node() -> None:
    nodes = (mig_node("m1"), mig_node("m2"), node("w1", 4, "A100-80GB"))
    refused = admission_error(job(1, 2, gpu_model=MIG), nodes, None)
    assert refused is not None and "a job can use only one per node" in refused
    assert admission_error(job(1, 2, gpu_model=MIG, gpus_per_node=1), nodes, None) is None
    assert admission_error(job(1, 2), nodes, None) is None  # whole GPUs exist
    only_mig = (mig_node("m1"),)
    assert "every GPU of the fleet is a MIG device" in (
        admission_error(job(1, 2), only_mig, None) or ""
    )
