"""The recent-cached reads' refresh keys fit the outbox's key column (100 characters)."""

from common.models import OutboxEntry
from jobs.services.page_cache import refresh_key


def test_a_refresh_key_fits_the_outbox_whatever_the_parameters():
    params = {
        "attempt": 99_999,
        "world_size": 1_048_576,
        "max_windows": 200,
        "max_cells": 20_000,
        "max_rows": 256,
    }
    key = refresh_key(9_999_999_999, "rank-heatmap", params)
    assert len(key) <= OutboxEntry._meta.get_field("key").max_length
    assert key != refresh_key(9_999_999_999, "rank-heatmap", params | {"attempt": 1})
