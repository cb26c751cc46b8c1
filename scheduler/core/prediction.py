"""Runtime prediction from history: how much of its time limit a job will use.

Users pad time limits, and by habit: the same person running the same script with the same
limit tends to use the same fraction of what they ask for. And the limit itself says much:
jobs asking for five minutes are often runs that fail or end at once, and use a small share
of it, while jobs asking for an hour use about half. So the predictor learns the ratio
actual/requested per time-limit class (classes a factor of sqrt(2) wide, `limit_class`)
at four levels: everyone, everyone at that limit, the owner at that limit,
and the owner's job name at that limit. It shrinks each level toward the broader one by its
number of observations (`shrinkage` pseudo-observations): the first run of a new script is
predicted by its owner's habit at that limit, a limit the owner never asked for by
everyone's at that limit, and an empty history by `prior_ratio` (1.0: the job uses its
whole limit).

On the Philly recipe (`bench/RESULTS.md`, "Runtime predictions by time-limit class") the
limit classes took the median relative error of a job's prediction from 42.2 % to 30.5 %.

It is incremental (`update` after each finished job, O(1)) and pure, so the production
cycle and the trace simulator use the same object.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    user: str
    name: str
    time_limit: float
    runtime: float


def limit_class(time_limit: float) -> int:
    """The class of a time limit: classes are a factor of sqrt(2) wide on a log scale (an
    hour and 66 minutes share one, 50 minutes and an hour do not, nor 5 minutes and an
    hour)."""
    return round(2.0 * math.log2(max(float(time_limit), 1.0)))


class _Mean:
    __slots__ = ("count", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value

    def shrunk(self, toward: float, strength: float) -> float:
        return (self.total + strength * toward) / (self.count + strength)


class RuntimePredictor:
    def __init__(
        self,
        shrinkage: float = 3.0,
        prior_ratio: float = 1.0,
        prior_weight: float = 1.0,
        limit_classes: bool = True,
    ):
        """`limit_classes` False: one class for every limit (owner and job name alone, the
        predictor before limit classes, which bench/bench_prediction.py compares with)."""
        self.shrinkage = shrinkage
        self.prior_ratio = prior_ratio
        self.prior_weight = prior_weight
        self.limit_classes = limit_classes
        self._global = _Mean()
        self._limit: dict[int, _Mean] = {}
        self._user: dict[tuple[str, int], _Mean] = {}
        self._user_name: dict[tuple[str, str, int], _Mean] = {}

    @classmethod
    def from_history(cls, records: Iterable[HistoryRecord], **params: Any) -> RuntimePredictor:
        predictor = cls(**params)
        for r in records:
            predictor.update(r.user, r.name, r.time_limit, r.runtime)
        return predictor

    def update(self, user: str, name: str, time_limit: float, runtime: float) -> None:
        """Learn from one finished job. Jobs without a positive time limit are ignored."""
        if time_limit <= 0 or runtime < 0:
            return
        ratio = min(runtime / time_limit, 1.0)
        cls = self._class(time_limit)
        self._global.add(ratio)
        self._limit.setdefault(cls, _Mean()).add(ratio)
        self._user.setdefault((user, cls), _Mean()).add(ratio)
        self._user_name.setdefault((user, name, cls), _Mean()).add(ratio)

    observe = update

    def ratio(self, user: str, name: str, time_limit: float) -> float:
        """Expected actual/requested for this owner's job of this name and time limit, in
        [0, 1]."""
        cls = self._class(time_limit)
        level = self._global.shrunk(self.prior_ratio, self.prior_weight)
        levels: list[_Mean | None] = [self._limit.get(cls)] if self.limit_classes else []
        levels += [self._user.get((user, cls)), self._user_name.get((user, name, cls))]
        for mean in levels:
            if mean is None:
                break
            level = mean.shrunk(level, self.shrinkage)
        return min(max(level, 0.0), 1.0)

    def _class(self, time_limit: float) -> int:
        return limit_class(time_limit) if self.limit_classes else 0

    def predict(self, user: str, name: str, time_limit: float) -> float:
        """Predicted runtime in seconds (the ratio times the time limit)."""
        return self.ratio(user, name, time_limit) * max(time_limit, 0.0)

    def observations(
        self, user: str | None = None, name: str | None = None, time_limit: float | None = None
    ) -> int:
        """How many finished jobs back a level: everyone; with a time limit, everyone at
        that limit, a user at it, or a user's job name at it."""
        if time_limit is None:
            return self._global.count
        cls = self._class(time_limit)
        if user is None:
            mean = self._limit.get(cls)
        elif name is None:
            mean = self._user.get((user, cls))
        else:
            mean = self._user_name.get((user, name, cls))
        return mean.count if mean is not None else 0
