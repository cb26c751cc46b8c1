"""The control worker for the advisor's browser test: fleet's Celery app consuming one queue,
with the advisor's candidates cut to three and each candidate's progress held a moment, so a
run over a small history ends in seconds and a page polling every 2 s sees it move.

    python -m tests.e2e.advisor_worker QUEUE
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import django

HOLD_S = 2.5  # longer than the page's polling interval: every step of progress is seen


def main(queue: str) -> None:
    django.setup()
    from scheduler.advisor import runs
    from scheduler.advisor.grid import Candidate
    from tests.e2e import control_worker

    def tiny_grid(policies: Any, known: Any, cap: int) -> list[Candidate]:
        return [
            Candidate("fcfs"),
            Candidate("sjf"),
            Candidate("priority", {"priority_weight_age": 10000.0}),
        ]

    simulate = runs.evaluate

    def held(*args: Any, progress: Callable[[int], None], **kw: Any) -> Any:
        def step(done: int) -> None:
            time.sleep(HOLD_S)
            progress(done)

        return simulate(*args, progress=step, **kw)

    runs.candidates = tiny_grid  # type: ignore[assignment]
    runs.evaluate = held  # type: ignore[assignment]
    control_worker.main(queue)


if __name__ == "__main__":
    main(sys.argv[1])
