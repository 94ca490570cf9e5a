"""The Celery app. The broker is Redis when REDIS_URL is set, else an embedded
filesystem broker under var/ (see settings).

The worker outlives a broker restart: it reconnects every 2 s at most (the
default backs off to 30 s), it drains the outbox (common.outbox) each time it
connects, and a channel of a broker connection already closed fails as a
connection error, which kombu and Celery recover from, not as the AttributeError
that used to stop the worker (see _guard_closed_channels).
"""

import functools
import logging
import os

from celery import Celery, bootsteps
from celery.worker.consumer import Consumer

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

logger = logging.getLogger(__name__)

app = Celery("rebound")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# How the worker's consumer retries a broker that went away.
BROKER_RECONNECT = {"interval_start": 0.5, "interval_step": 0.5, "interval_max": 2.0}


class ReconnectingConsumer(Consumer):
    """The worker's consumer (settings: CELERY_WORKER_CONSUMER), reconnecting at most
    BROKER_RECONNECT["interval_max"] seconds after the broker is back."""

    def ensure_connected(self, conn):
        conn.ensure_connection = functools.partial(conn.ensure_connection, **BROKER_RECONNECT)
        return super().ensure_connected(conn)


class DrainOutboxOnConnect(bootsteps.StartStopStep):
    """At each (re)connection to the broker, send what the outbox kept while it was
    away, without waiting for beat."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, c):
        from common.outbox import outbox_drain

        try:
            outbox_drain()
        except Exception:  # the periodic drain tries again; the worker goes on
            logger.exception("outbox drain at broker connection failed")


app.steps["consumer"].add(DrainOutboxOnConnect)


def _guard_closed_channels() -> None:
    """kombu's Redis transport can act on a channel of a connection already collected.
    When the broker goes away, the worker's consumer first `collect()`s its connection
    (which sets the transport's `client` to None but keeps the default channel), then
    `close()`s it: closing the default channel restores its unacknowledged messages
    (under load, with late acks, there are some), which rebuilds the channel's
    connection pool from `self.connection.client.hostname`: AttributeError("'NoneType'
    object has no attribute 'hostname'"). That is no connection error, so it escaped
    `ignore_errors` as "Unrecoverable error" and the worker (and beat) exited. Raised as
    a connection error, it is ignored there like the others (the messages come back
    through the visibility timeout) and the consumer reconnects. The same holds for
    any other late use of such a channel (an acknowledgement, a timer)."""
    try:
        from kombu.transport import redis as kombu_redis
    except ImportError:  # no redis client: the filesystem broker only
        return
    original = kombu_redis.Channel._connparams
    if getattr(original, "closed_channel_guard", False):
        return

    @functools.wraps(original)
    def _connparams(self, asynchronous=False):
        if self.connection is None or self.connection.client is None:
            raise kombu_redis.redis.exceptions.ConnectionError(
                "a channel of a broker connection that was closed"
            )
        return original(self, asynchronous=asynchronous)

    _connparams.closed_channel_guard = True
    kombu_redis.Channel._connparams = _connparams


_guard_closed_channels()
