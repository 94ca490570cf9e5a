"""Real processes for tests: a Celery worker and a gunicorn server on the test database."""

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import requests
from django.db import connection

from console.celery import app
from console.queues import queue_names

ROOT = Path(__file__).resolve().parents[1]


def database_url() -> str:
    """The URL of the database the tests run on, for another process to use."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    user, host, port = s["USER"] or "postgres", s["HOST"] or "127.0.0.1", s["PORT"] or 5432
    return f"postgres://{user}@{host}:{port}/{s['NAME']}"


def need_program(name: str, install: str, require: str = "REBOUND_REQUIRE_DEPLOY_TOOLS") -> None:
    """Skip the calling test without `name` on PATH; fail it instead where CI requires
    the tool (`require`=1: .ci/run installs the deployment's tools and the monitoring's,
    REBOUND_REQUIRE_DEPLOY_TOOLS and REBOUND_REQUIRE_MONITORING)."""
    if shutil.which(name) is None:
        why = f"needs {name} ({install})"
        if os.environ.get(require) == "1":
            pytest.fail(f"{require} is set, but this test {why}")
        pytest.skip(why)


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


def queue_prefix() -> str:
    """A queue prefix (REBOUND_CELERY_QUEUE) no other test uses."""
    return f"test-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def celery_worker(
    loglevel: str = "INFO",
    *,
    env: dict | None = None,
    beat_schedule: Path | None = None,
    logfile: Path | None = None,
    prefix: str | None = None,
    roles: tuple[str, ...] | None = None,
):
    """A worker process on the project's broker and queues of its own (all those of a
    new prefix, console.queues); tasks this process sends go to them meanwhile. Yields
    the process; its output is in `.output` once it has stopped. `env` goes on top of
    the defaults (a REDIS_URL of the test's own); with `beat_schedule` it runs beat too,
    as scripts/run does; with `logfile` its log goes there (a long, chatty run would
    fill the pipe). Workers that split the queues between them share a `prefix`
    (queue_prefix()), each consuming its `roles` only (`-Q`, as deploy/ starts them)."""
    queue = prefix or queue_prefix()
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
    cmd += ["--without-gossip", "--without-mingle", "--loglevel", loglevel]
    if roles is not None:
        cmd += ["-Q", ",".join(queue_names(queue, roles))]
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


def queue_depth(name: str) -> int:
    """Messages waiting in queue `name` on the broker (none taken by a worker yet)."""
    with app.connection_for_read() as conn:
        try:
            return conn.default_channel.queue_declare(queue=name, passive=True).message_count
        except conn.channel_errors:  # never declared, or emptied away (Redis)
            return 0


class PgBouncer:
    """PgBouncer in transaction mode on a free port, in front of the test database: one
    client's transactions land on any of `pool_size` server connections, so whatever
    relies on session state fails through it. `url` is the test database through it;
    `available` says whether PgBouncer is installed at all."""

    available = shutil.which("pgbouncer") is not None

    def __init__(self, tmp_path: Path, pool_size: int = 4):
        self.port = free_port()
        s = connection.settings_dict
        self.dbname = s["NAME"]
        self.upstream = {
            "host": s["HOST"] or "127.0.0.1",
            "port": s["PORT"] or 5432,
            "user": s["USER"] or "postgres",
        }
        self.url = f"postgres://{self.upstream['user']}@127.0.0.1:{self.port}/{self.dbname}"
        self.dir = tmp_path
        self.pool_size = pool_size
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 10) -> None:
        # Refuses to run as root: it then runs as the database's system user, which must
        # read its files (pytest's directories are the owner's only).
        as_user = None
        if os.geteuid() == 0:
            as_user = pwd.getpwnam("postgres") if _has_user("postgres") else pwd.getpwnam("nobody")
            self.dir = Path(tempfile.mkdtemp(prefix="rebound-pgbouncer-"))
            os.chown(self.dir, as_user.pw_uid, as_user.pw_gid)
        self.dir.mkdir(parents=True, exist_ok=True)
        u = self.upstream
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"{self.dbname} = host={u['host']} port={u['port']} user={u['user']}"
            f" dbname={self.dbname} timezone=UTC\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            "auth_type = any\npool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\nmax_client_conn = 200\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
        )
        cmd = ["pgbouncer", str(ini)]
        if as_user is not None:
            os.chown(ini, as_user.pw_uid, as_user.pw_gid)
            cmd += ["-u", as_user.pw_name]
        self.process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.process.communicate()[0] + self.log()
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                return
            time.sleep(0.05)
        raise TimeoutError("pgbouncer did not listen: " + self.log())

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process, timeout=5)
            self.process = None
        if self.dir.name.startswith("rebound-pgbouncer-"):
            shutil.rmtree(self.dir, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
