"""The production scheduling cycle: snapshot from the database, the pure policy, and
compare-and-swap application of its plan (see runner.py). Modules here use Django; the
pure core (scheduler.core, scheduler.policies) does not."""
