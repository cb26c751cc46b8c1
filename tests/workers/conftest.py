"""Real agents on Redis for the tests under tests/workers: `control` pumps the control
queue through the control tasks in the test; `agents` starts agents on new nodes and waits
for them to register (see agent_harness)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings

from fleet.models import Gpu, Node
from fleet.services.agents import node_key_create
from tests.workers.agent_harness import AgentProcess, ControlPump, start_agent, unique_name


@pytest.fixture
def control(django_capture_on_commit_callbacks: Any, settings: Any) -> Iterator[ControlPump]:
    # The control side sends the grace with each start: the same 2 s the harness's agents use.
    settings.FLEET_JOB_GRACE = 2
    pump = ControlPump(unique_name("control-test"), django_capture_on_commit_callbacks)
    yield pump
    pump.close()
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(pump.queue)


StartAgent = Callable[..., tuple[Node, AgentProcess]]


@pytest.fixture
def agents(tmp_path: Any, control: ControlPump) -> Iterator[StartAgent]:
    started: list[AgentProcess] = []

    def start(
        simulate: str = "2xA100-80GB", env: dict[str, str] | None = None
    ) -> tuple[Node, AgentProcess]:
        name = unique_name("e2e")
        node, key = node_key_create(name=name)
        agent = start_agent(name, key, tmp_path / name, control.queue, simulate=simulate, env=env)
        started.append(agent)
        control.pump(
            lambda: (
                Gpu.objects.filter(node=node).exists()
                and Node.objects.get(pk=node.pk).state == "up"
            ),
            what=f"{name} to register",
        )
        return Node.objects.get(pk=node.pk), agent

    yield start
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    for agent in started:
        agent.cleanup()
        broker.delete(f"node.{agent.name}")
