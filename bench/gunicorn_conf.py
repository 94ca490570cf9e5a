"""Gunicorn settings for bench/ingest.py's server.

The server keeps the settings' defaults (DEBUG included) but one: with DEBUG
on, Django keeps the SQL of every query in `connection.queries`, which
production (REBOUND_DEBUG=0) never does, so the benchmark's workers do not
either. Set REBOUND_BENCH_QUERY_LOG=1 to measure with it (on this machine it
made no measurable difference, before or after the ingest changes).
"""

import os

worker_class = "sync"
loglevel = "warning"
accesslog = None
timeout = 60
graceful_timeout = 5


def post_worker_init(worker):
    if os.environ.get("REBOUND_BENCH_QUERY_LOG") == "1":
        return
    from django.db.backends.base.base import BaseDatabaseWrapper

    # Log queries only when something asks for it explicitly (assertNumQueries does).
    BaseDatabaseWrapper.queries_logged = property(lambda self: self.force_debug_cursor)
