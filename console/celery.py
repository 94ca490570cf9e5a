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
    """kombu's Redis transport can act on a channel of a connection that the consumer
    already closed (`Connection.collect()` sets the transport's `client` to None):
    after a broker restart, a late acknowledgement or a timer of the old connection
    rebuilds the channel's connection pool from `self.connection.client.hostname`,
    raising AttributeError("'NoneType' object has no attribute 'hostname'"). That is
    no connection error, so it escaped the worker's recovery as "Unrecoverable error"
    and the worker (and beat with it) exited. Raised as a connection error instead,
    the acknowledgement is logged as lost (the message is delivered again) and the
    consumer reconnects."""
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
