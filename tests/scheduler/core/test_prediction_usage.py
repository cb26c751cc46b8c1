import pytest

from scheduler.core.prediction import HistoryRecord, RuntimePredictor
from scheduler.core.usage import decay_usage


def test_empty_history_predicts_the_time_limit():
    assert RuntimePredictor().predict("ada", "train", 3600) == 3600


def test_owner_and_name_beats_owner_beats_everyone():
    history = [HistoryRecord("ada", "train", 1000, 200)] * 20  # ada's train uses 20 %
    history += [HistoryRecord("ada", "eval", 1000, 800)] * 20  # her eval uses 80 %
    history += [HistoryRecord("bob", "x", 1000, 1000)] * 40  # bob uses it all
    p = RuntimePredictor.from_history(history)
    train, evaluate = p.ratio("ada", "train"), p.ratio("ada", "eval")
    assert train == pytest.approx(0.2, abs=0.06)
    assert evaluate == pytest.approx(0.8, abs=0.06)
    # A new script of ada's: her habit (half), pulled a little toward everyone (0.75).
    assert 0.5 <= p.ratio("ada", "new") < 0.6
    # A new user: everyone's average.
    assert p.ratio("cy", "x") == pytest.approx(p.ratio("zed", "y"))
    assert p.predict("ada", "train", 7200) == pytest.approx(train * 7200)


def test_few_observations_are_shrunk_toward_the_broader_level():
    p = RuntimePredictor(shrinkage=3.0)
    for _ in range(30):
        p.update("bob", "long", 1000, 900)
    p.update("bob", "quick", 1000, 100)
    assert 0.6 < p.ratio("bob", "quick") < 0.9  # one run is not enough to believe 10 %
    for _ in range(30):
        p.update("bob", "quick", 1000, 100)
    assert p.ratio("bob", "quick") < 0.2
    assert p.observations("bob", "quick") == 31


def test_runtime_over_the_limit_counts_as_the_limit():
    p = RuntimePredictor(prior_weight=0)
    p.update("a", "j", 100, 500)
    assert p.ratio("a", "j") == 1.0


def test_decay_halves_usage_each_half_life():
    assert decay_usage(1000.0, 0.0, 3600, 3600) == pytest.approx(500.0)
    assert decay_usage(0.0, 100.0, 0, 3600) == pytest.approx(100.0)
    assert decay_usage(1000.0, 100.0, 7200, 3600) == pytest.approx(250.0 + 50.0)
