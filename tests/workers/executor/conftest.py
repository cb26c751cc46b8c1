import pytest

from tests.workers.executor import helpers


@pytest.fixture(autouse=True)
def _kill_leftover_jobs():
    """A test that fails half-way must not leave its job processes running."""
    yield
    while helpers.CREATED:
        helpers.CREATED.pop().kill_all()
