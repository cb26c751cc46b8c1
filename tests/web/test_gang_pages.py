"""Multi-node jobs and host resources on the pages: the members of a job with one log per
rank, and each node's CPUs, memory and group with the free GPUs of each group on the fleet
page."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from fleet.models import Job, JobMember, Node
from fleet.services.job_states import SCHEDULER, Actor, job_transition
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def run_gang(job: Job, shares: list[tuple[Node, list[int]]]) -> Job:
    """Dispatch and start `job` with one member per (node, GPUs), rank 0 first."""
    job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER, reason="placed",
        fields={"node": shares[0][0], "gpu_indices": shares[0][1]},
    )  # fmt: skip
    for rank, (node, indices) in enumerate(shares):
        JobMember.objects.create(job=job, attempt=1, rank=rank, node=node, gpu_indices=indices)
    started = job_transition(
        job_id=job.pk, action="start", actor=Actor.node(shares[0][0].name), reason=""
    )
    JobMember.objects.filter(job=job).update(state="running")
    return started


def test_the_job_page_lists_its_members_and_offers_each_ranks_log(
    owner_web: Client, owner: Any, team: Any, racks: Any
) -> None:
    a, _, c = racks
    job = JobFactory(owner=owner, team=team, name="llm", gpus=6, gpus_per_node=3, cpus=8)
    run_gang(job, [(a, [0, 1, 2]), (c, [1, 2, 3])])

    html = owner_web.get(f"/jobs/{job.pk}/").content.decode()

    assert "6 whole: 2 nodes of 3" in html and "8 CPUs on each node" in html
    rank0 = html[html.index('id="member-0"') : html.index('id="member-1"')]
    assert "sim-a" in rank0 and "0, 1, 2" in rank0 and ">running<" in rank0
    rank1 = html[html.index('id="member-1"') :]
    rank1 = rank1[: rank1.index("</tr>")]
    assert "sim-c" in rank1 and "1, 2, 3" in rank1 and ">running<" in rank1
    assert '<select id="log-rank">' in html
    assert '<option value="0">rank 0</option><option value="1">rank 1</option>' in html
    partial = owner_web.get(f"/jobs/{job.pk}/?partial=1").content.decode()
    assert 'id="member-1"' in partial  # members' states refresh with the page


def test_a_single_node_job_has_no_members_table_and_no_rank_picker(
    owner_web: Client, owner: Any, team: Any, racks: Any
) -> None:
    job = JobFactory(owner=owner, team=team, name="small", gpus=1)
    run_gang(job, [(racks[0], [0])])
    html = owner_web.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="member-0"' not in html and "log-rank" not in html
    assert "sim-a</a>, GPU 0" in html


def test_the_fleet_page_shows_each_nodes_cpus_memory_group_and_free_gpus_per_group(
    owner_web: Client, owner: Any, team: Any, racks: Any
) -> None:
    a, b, c = racks
    job = JobFactory(
        owner=owner, team=team, name="llm", gpus=6, gpus_per_node=3, cpus=8, memory_mb=16000
    )
    run_gang(job, [(a, [0, 1, 2]), (c, [1, 2, 3])])
    Node.objects.filter(pk=b.pk).update(resource_enforcement="none: cgroup v2 is not mounted")

    html = owner_web.get("/fleet/").content.decode()

    def node_section(name: str) -> str:
        start = html.index(f">{name}</a>")
        return html[start : html.index("</section>", start)]

    for name in ("sim-a", "sim-c"):
        section = node_section(name)
        assert "CPUs 8/32 · memory 16000/262144 MB · group rack-1" in section, section
        assert "3/4 busy" in section and "llm" in section  # the tiles of both members
    section = node_section("sim-b")
    assert "CPUs 0/32 · memory 0/262144 MB · group rack-2" in section
    assert 'title="none: cgroup v2 is not mounted">limits not enforced' in section
    # 8 A100 in rack-1, 6 held: 2 free, 1 at most on one node; rack-2 all free.
    assert "<td>rack-1</td><td><strong>2</strong></td><td>1</td><td>2</td>" in html
    assert "<td>rack-2</td><td><strong>2</strong></td><td>2</td><td>1</td>" in html
    assert "<strong>6</strong> busy" in html and "<strong>4</strong> free" in html


def test_the_node_page_says_what_the_host_offers_and_whether_limits_hold(
    owner_web: Client, owner: Any, team: Any, racks: Any
) -> None:
    a, b, c = racks
    job = JobFactory(
        owner=owner, team=team, name="llm", gpus=6, gpus_per_node=3, cpus=8, memory_mb=16000
    )
    run_gang(job, [(a, [0, 1, 2]), (c, [1, 2, 3])])
    Node.objects.filter(pk=c.pk).update(address="10.0.0.7")
    Node.objects.filter(pk=b.pk).update(
        resource_enforcement="none: /sys/fs/cgroup is not writable by the agent"
    )

    html = owner_web.get("/nodes/sim-c/").content.decode()
    assert "CPUs 8/32 in use · memory 16000/262144 MB in use" in html
    assert "<code>10.0.0.7</code>" in html and "<dd>rack-1</dd>" in html
    assert "each job is held to its CPUs and memory (cgroup v2)" in html
    html = owner_web.get("/nodes/sim-b/").content.decode()
    assert "CPUs 0/32 in use" in html
    assert "not enforced: /sys/fs/cgroup is not writable by the agent" in html
