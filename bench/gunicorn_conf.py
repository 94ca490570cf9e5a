"""Gunicorn settings for bench/ingest.py's server.

The server keeps the settings' defaults (DEBUG included) except one thing: with
DEBUG on, Django records every query's SQL, and for ingest that means rendering
each batch's arrays a second time just to keep them in `connection.queries`.
Production (REBOUND_DEBUG=0) never does that, so the benchmark turns it off.
Set REBOUND_BENCH_QUERY_LOG=1 to measure with it.
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
