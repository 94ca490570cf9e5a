"""The brokers: the embedded one writes each message file whole (a reader never sees part
of one); Redis connections leave reconnecting to Celery."""

import json
import os

import pytest
from django.conf import settings
from kombu import Connection

from console.broker import Channel


def test_a_message_file_appears_only_when_complete(tmp_path, monkeypatch):
    """Between the write and the rename, only a `.part` file exists, which readers skip."""
    conn = Connection(
        "filesystem://localhost/",
        transport="console.broker:Transport",
        transport_options={"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path)},
    )
    channel = conn.default_channel
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append(sorted(os.listdir(tmp_path)))  # just before the rename
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    channel._put("q", {"body": "x" * 100_000})
    assert len(seen[0]) == 1 and seen[0][0].endswith(".q.msg.part")
    [name] = os.listdir(tmp_path)
    assert name.endswith(".q.msg")
    assert json.loads((tmp_path / name).read_text())["body"] == "x" * 100_000
    assert isinstance(channel, Channel)
    assert channel._get("q")["body"] == "x" * 100_000
    conn.release()


@pytest.mark.skipif(not settings.REDIS_URL, reason="the Redis broker's options (set REDIS_URL)")
def test_redis_connections_leave_reconnecting_to_celery():
    """redis-py retries nothing on the broker's connections: a pub/sub read it retried
    after a broker restart reconnected and then blocked with no timeout, and the
    worker's event loop with it (the broker-outage tests hung that way)."""
    with Connection(
        settings.CELERY_BROKER_URL,
        transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
    ) as conn:
        kwargs = conn.default_channel.pool.connection_kwargs
        connection = conn.default_channel.pool.connection_class(**kwargs)
        assert connection.retry.get_retries() == 0, kwargs
