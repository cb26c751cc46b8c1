"""The signed envelope (workers/wire.py): what an agent's gate lets through, and what not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.wire import (
    CLOCK_SKEW_S,
    Gate,
    NonceBook,
    Signer,
    WireError,
    key_generate,
    public_key_of,
)

CONTROL = key_generate()
START = "workers.tasks.start_job"


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def gate(tmp_path: Path, clock: Clock, node: str = "gpu-01") -> Gate:
    return Gate(
        node=node,
        control_public_key=public_key_of(CONTROL),
        nonces=NonceBook(tmp_path / "nonces", clock=clock),
        clock=clock,
    )


def seal(
    clock: Clock, task: str = START, node: str = "gpu-01", ttl: float = 120, key: str = CONTROL
):
    return Signer(key, clock=clock).seal(task, node, {"job_id": 7, "attempt": 1}, ttl)


def refusal(g: Gate, envelope: dict[str, str], task: str = START) -> str:
    with pytest.raises(WireError) as info:
        g.open(task, envelope.get("m"), envelope.get("s"))
    return str(info.value)


def test_a_current_message_signed_for_this_node_and_task_opens(tmp_path: Path) -> None:
    clock = Clock()
    message = gate(tmp_path, clock).open(START, **_ms(seal(clock)))
    assert (message.task, message.node, message.args) == (
        START,
        "gpu-01",
        {"job_id": 7, "attempt": 1},
    )
    assert message.expires_at == clock.now + 120


def _ms(envelope: dict[str, str]) -> dict[str, str]:
    return {"body": envelope["m"], "signature": envelope["s"]}


def test_unsigned_forged_tampered_and_misdirected_messages_are_refused(tmp_path: Path) -> None:
    clock = Clock()
    g = gate(tmp_path, clock)
    good = seal(clock)
    assert "unsigned" in refusal(g, {"job_id": "7"})
    assert "unsigned" in refusal(g, {"m": good["m"]})
    assert refusal(g, seal(clock, key=key_generate())) == "bad signature"
    body = json.loads(good["m"])
    body["args"]["attempt"] = 2
    assert refusal(g, {"m": json.dumps(body), "s": good["s"]}) == "bad signature"
    assert refusal(g, {"m": good["m"], "s": good["s"][:-4] + "AAAA"}) == "bad signature"
    assert "delivered to 'workers.tasks.start_job'" in refusal(
        g, seal(clock, task="workers.tasks.stop_job")
    )
    assert "signed for node 'gpu-02'" in refusal(g, seal(clock, node="gpu-02"))


def test_expired_and_future_messages_are_refused(tmp_path: Path) -> None:
    clock = Clock()
    g = gate(tmp_path, clock)
    envelope = seal(clock, ttl=60)
    clock.now += 60 + CLOCK_SKEW_S + 1
    assert "expired" in refusal(g, envelope)
    ahead = Clock(clock.now + CLOCK_SKEW_S + 5)
    assert "in the future" in refusal(g, seal(ahead))


def test_a_handled_message_is_refused_as_a_replay_even_after_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    g = gate(tmp_path, clock)
    envelope = seal(clock)
    first = g.open(START, envelope["m"], envelope["s"])
    # Not yet handled (the agent died mid-way): a redelivery opens again.
    g.open(START, envelope["m"], envelope["s"])
    g.done(first)
    assert "replayed" in refusal(g, envelope)
    assert "replayed" in refusal(gate(tmp_path, clock), envelope)  # a restarted agent
    # Nonces are forgotten once their message could no longer be taken anyway.
    clock.now += 120 + CLOCK_SKEW_S + 1
    assert NonceBook(tmp_path / "nonces", clock=clock).seen(first.nonce) is False
    assert "expired" in refusal(gate(tmp_path, clock), envelope)


def test_keys_are_checked_when_loaded() -> None:
    with pytest.raises(WireError, match="32 bytes"):
        Signer("c2hvcnQ")
    with pytest.raises(WireError, match="base64"):
        public_key_of("not base64 at all!")
