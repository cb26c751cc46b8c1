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
    train, evaluate = p.ratio("ada", "train", 1000), p.ratio("ada", "eval", 1000)
    assert train == pytest.approx(0.2, abs=0.06)
    assert evaluate == pytest.approx(0.8, abs=0.06)
    # A new script of ada's: her habit (half), pulled a little toward everyone (0.75).
    assert 0.5 <= p.ratio("ada", "new", 1000) < 0.6
    # A new user: everyone's average.
    assert p.ratio("cy", "x", 1000) == pytest.approx(p.ratio("zed", "y", 1000))
    # A limit in the same class (1000 s and 1200 s share one): the same ratio.
    assert p.predict("ada", "train", 1200) == pytest.approx(train * 1200)


def test_few_observations_are_shrunk_toward_the_broader_level():
    p = RuntimePredictor(shrinkage=3.0)
    for _ in range(30):
        p.update("bob", "long", 1000, 900)
    p.update("bob", "quick", 1000, 100)
    assert 0.6 < p.ratio("bob", "quick", 1000) < 0.9  # one run is not enough to believe 10 %
    for _ in range(30):
        p.update("bob", "quick", 1000, 100)
    assert p.ratio("bob", "quick", 1000) < 0.2
    assert p.observations("bob", "quick", 1000) == 31
    assert p.observations("bob", "quick", 100_000) == 0


def test_runtime_over_the_limit_counts_as_the_limit():
    p = RuntimePredictor(prior_weight=0)
    p.update("a", "j", 100, 500)
    assert p.ratio("a", "j", 100) == 1.0


def test_each_time_limit_class_has_its_own_ratio():
    # Everyone's five-minute jobs use a tenth of the limit, their hour-long ones most of it.
    history = [HistoryRecord(f"u{i % 5}", "run", 300, 30) for i in range(50)]
    history += [HistoryRecord(f"u{i % 5}", "run", 3600, 2880) for i in range(50)]
    # ada's hour-long jobs use a quarter: her habit at that limit.
    history += [HistoryRecord("ada", "run", 3600, 900)] * 20
    p = RuntimePredictor.from_history(history)
    assert p.ratio("cy", "new", 300) == pytest.approx(0.1, abs=0.02)
    assert p.ratio("cy", "new", 3600) == pytest.approx(0.8 * 50 / 70 + 0.25 * 20 / 70, abs=0.03)
    assert p.ratio("ada", "run", 3600) == pytest.approx(0.25, abs=0.08)
    # ada never asked for five minutes: everyone's five-minute habit, not her hour's.
    assert p.ratio("ada", "run", 300) == pytest.approx(0.1, abs=0.02)
    # An hour and 4000 s share a class; with no history at either, 2 h and a day both
    # fall back to everyone's ratio.
    assert p.ratio("cy", "new", 4000) == p.ratio("cy", "new", 3600)
    assert p.ratio("cy", "new", 7200) == pytest.approx(p.ratio("cy", "new", 86400))
    assert p.ratio("cy", "new", 7200) != pytest.approx(p.ratio("cy", "new", 3600), abs=0.05)
    # Without classes (bench_prediction's baseline): one ratio per owner and name.
    plain = RuntimePredictor.from_history(history, limit_classes=False)
    assert plain.ratio("ada", "run", 300) == plain.ratio("ada", "run", 3600)
    # A new user: the mean ratio of all 120 jobs (their ratios sum to 50), with the prior
    # of one whole limit.
    assert plain.ratio("cy", "new", 300) == pytest.approx((5 + 40 + 5 + 1) / 121)


def test_decay_halves_usage_each_half_life():
    assert decay_usage(1000.0, 0.0, 3600, 3600) == pytest.approx(500.0)
    assert decay_usage(0.0, 100.0, 0, 3600) == pytest.approx(100.0)
    assert decay_usage(1000.0, 100.0, 7200, 3600) == pytest.approx(250.0 + 50.0)
