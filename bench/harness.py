"""What the benchmarks share: their own PostgreSQL database, migrated, Django set up on it,
and waiting for a condition.

The benchmarks use a database of their own (`rebound_bench` by default) so they
never touch a database tests or people are using.
"""

import os
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/rebound_bench"


def ensure_database(url: str) -> None:
    """Create the URL's database when it is missing (through the `postgres` database)."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def setup_django(url: str, *, migrate: bool = True) -> None:
    """Django configured on `url` (created and migrated when needed), in this process."""
    ensure_database(url)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)


def pg_connect(url: str, **kwargs) -> psycopg.Connection:
    return psycopg.connect(url, connect_timeout=10, **kwargs)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


class BenchError(Exception):
    """A benchmark run that could not be measured."""


def until(condition, what: str, timeout_s: float, interval_s: float = 0.01):
    """`condition()`'s first true value, polled every `interval_s`; BenchError after
    `timeout_s` naming `what` was waited for."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)
