"""Runtime prediction from history: how much of its time limit a job will use.

Users pad time limits, and by habit: the same person running the same script tends to use
the same fraction of what they ask for. The predictor learns the ratio actual/requested
at three levels, the owner and job name, the owner, and everyone, and shrinks each level
toward the broader one by its number of observations (`shrinkage` pseudo-observations):
a first run of a new script is predicted by its owner's habit, a new user by everyone's,
and an empty history by `prior_ratio` (1.0: the job uses its whole limit).

It is incremental (`update` after each finished job, O(1)) and pure, so the production
cycle and the trace simulator use the same object.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    user: str
    name: str
    time_limit: float
    runtime: float


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
    def __init__(self, shrinkage: float = 3.0, prior_ratio: float = 1.0, prior_weight: float = 1.0):
        self.shrinkage = shrinkage
        self.prior_ratio = prior_ratio
        self.prior_weight = prior_weight
        self._global = _Mean()
        self._user: dict[str, _Mean] = {}
        self._user_name: dict[tuple[str, str], _Mean] = {}

    @classmethod
    def from_history(cls, records: Iterable[HistoryRecord], **params: float) -> RuntimePredictor:
        predictor = cls(**params)
        for r in records:
            predictor.update(r.user, r.name, r.time_limit, r.runtime)
        return predictor

    def update(self, user: str, name: str, time_limit: float, runtime: float) -> None:
        """Learn from one finished job. Jobs without a positive time limit are ignored."""
        if time_limit <= 0 or runtime < 0:
            return
        ratio = min(runtime / time_limit, 1.0)
        self._global.add(ratio)
        self._user.setdefault(user, _Mean()).add(ratio)
        self._user_name.setdefault((user, name), _Mean()).add(ratio)

    observe = update

    def ratio(self, user: str, name: str) -> float:
        """Expected actual/requested for this owner's job of this name, in [0, 1]."""
        level = self._global.shrunk(self.prior_ratio, self.prior_weight)
        mean = self._user.get(user)
        if mean is not None:
            level = mean.shrunk(level, self.shrinkage)
            mean = self._user_name.get((user, name))
            if mean is not None:
                level = mean.shrunk(level, self.shrinkage)
        return min(max(level, 0.0), 1.0)

    def predict(self, user: str, name: str, time_limit: float) -> float:
        """Predicted runtime in seconds (the ratio times the time limit)."""
        return self.ratio(user, name) * max(time_limit, 0.0)

    def observations(self, user: str | None = None, name: str | None = None) -> int:
        """How many finished jobs back a level (everyone, a user, or a user's job name)."""
        if user is None:
            return self._global.count
        mean = self._user.get(user) if name is None else self._user_name.get((user, name))
        return mean.count if mean is not None else 0
