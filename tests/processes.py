"""Real processes for tests: a Celery worker and a gunicorn server on the test database."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import requests
from django.db import connection

from console.celery import app

ROOT = Path(__file__).resolve().parents[1]


def database_url() -> str:
    """The URL of the database the tests run on, for another process to use."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    user, host, port = s["USER"] or "postgres", s["HOST"] or "127.0.0.1", s["PORT"] or 5432
    return f"postgres://{user}@{host}:{port}/{s['NAME']}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(process: subprocess.Popen, timeout: float = 20, *, group: bool = False) -> str:
    """SIGTERM, then SIGKILL after `timeout`; with `group` (a process started in a
    session of its own), SIGKILL goes to its whole group: a child left behind (a
    worker's beat) would hold the output pipe open and the read would never end."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.kill()
        out, _ = process.communicate()
    return out or ""


@contextlib.contextmanager
def celery_worker(
    loglevel: str = "INFO",
    *,
    env: dict | None = None,
    beat_schedule: Path | None = None,
    logfile: Path | None = None,
):
    """A worker process on the project's broker and a queue of its own; tasks this
    process sends go to that queue meanwhile. Yields the process; its output is
    in `.output` once it has stopped. `env` goes on top of the defaults (a REDIS_URL
    of the test's own); with `beat_schedule` it runs beat too, as scripts/run does;
    with `logfile` its log goes there (a long, chatty run would fill the pipe)."""
    queue = f"test-{uuid.uuid4().hex[:8]}"
    eager, default_queue = app.conf.task_always_eager, app.conf.task_default_queue
    app.conf.task_always_eager = False
    app.conf.task_default_queue = queue
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REBOUND_CELERY_QUEUE": queue,
        "REBOUND_RECOVERY_DRIVER": "noop",  # a test gives its cluster a driver of its own
        **(env or {}),
    }
    cmd = [sys.executable, "-m", "celery", "-A", "console", "worker", "--pool", "solo"]
    cmd += ["--without-gossip", "--without-mingle", "--loglevel", loglevel, "-Q", queue]
    if beat_schedule is not None:
        cmd += ["--beat", "--schedule", str(beat_schedule)]
    if logfile is not None:
        cmd += ["--logfile", str(logfile)]
    worker = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=beat_schedule is not None,  # beat is a child process
    )
    try:
        yield worker
    finally:
        app.conf.task_always_eager, app.conf.task_default_queue = eager, default_queue
        if beat_schedule is not None and worker.poll() is not None:
            # The worker died: its beat, left behind, would hold the output pipe open.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
        worker.output = _stop(worker, group=beat_schedule is not None)


class Server:
    """gunicorn serving the console on the test database, stoppable and restartable
    on the same port (the console going away under a running job)."""

    def __init__(self, tmp_path: Path, env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.var = tmp_path
        self.env = env or {}  # on top of the defaults (a DATABASE_URL through a proxy...)
        self.process: subprocess.Popen | None = None
        self.output = ""

    def start(self, timeout: float = 30) -> None:
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "REBOUND_VAR_DIR": str(self.var),
            "REBOUND_CELERY_QUEUE": app.conf.task_default_queue,
            **self.env,
        }
        cmd = [sys.executable, "-m", "gunicorn", "console.wsgi", "--workers", "1"]
        cmd += ["--bind", f"127.0.0.1:{self.port}", "--log-level", "warning"]
        self.process = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.process.communicate()[0]
            try:
                requests.get(self.url + "/api/v1/schema", timeout=2)
                return
            except requests.RequestException:
                time.sleep(0.2)
        raise TimeoutError("gunicorn did not answer")

    def stop(self) -> None:
        if self.process is not None:
            self.output += _stop(self.process)
            self.process = None
