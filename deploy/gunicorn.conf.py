"""gunicorn settings for the console behind nginx (deploy/systemd/rebound-web.service):

    .venv/bin/gunicorn console.wsgi --config deploy/gunicorn.conf.py

Sync workers, one per core unless REBOUND_WEB_WORKERS says otherwise: an ingest request
is CPU work in the worker and in PostgreSQL, with nothing to wait on in between that
threads would fill. They listen on REBOUND_WEB_BIND (127.0.0.1:8000), for nginx only.
"""

import multiprocessing
import os

bind = os.environ.get("REBOUND_WEB_BIND") or "127.0.0.1:8000"
workers = int(os.environ.get("REBOUND_WEB_WORKERS") or multiprocessing.cpu_count())
worker_class = "sync"
# A 5 MiB batch (the ingest limit) takes well under a second; a worker silent this long
# is stuck and is replaced.
timeout = 60
# A restart (systemctl reload: SIGHUP) lets requests in flight finish.
graceful_timeout = 30
# Each worker is replaced after this many requests, not all at once: memory a long run
# might gather stays bounded.
max_requests = 20_000
max_requests_jitter = 2_000
accesslog = "-"
# Django reads X-Forwarded-Proto itself (SECURE_PROXY_SSL_HEADER); gunicorn believes the
# forwarded headers from the proxy on this host only.
forwarded_allow_ips = "127.0.0.1"
