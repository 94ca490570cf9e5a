import pytest

from console.metrics.collector import forget_totals


@pytest.fixture(autouse=True)
def fresh_totals():
    """Each test's first scrape reads the totals anew: the cache outlives a test's
    rolled-back rows."""
    forget_totals()
    yield
    forget_totals()
