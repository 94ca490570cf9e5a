"""scripts/supervise, which scripts/run keeps its Celery worker alive with: a command
that dies is started again after a back-off, each restart logged; stopping the
supervisor stops the command."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.processes import ROOT

SUPERVISE = ROOT / "scripts" / "supervise"


def read_pid(path: Path, not_pid: int | None = None, timeout_s: float = 20) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid = int(path.read_text())
        except (FileNotFoundError, ValueError):
            pid = None
        if pid and pid != not_pid and alive(pid):
            return pid
        time.sleep(0.1)
    raise AssertionError(f"no new process wrote {path}")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_a_supervised_command_that_dies_is_restarted_and_logged_and_stopping_stops_it(tmp_path):
    log, pidfile = tmp_path / "worker.log", tmp_path / "pid"
    # A stand-in for the worker: starts a process of its own (as Celery's embedded beat),
    # writes both pids, then waits to be killed.
    child = (
        "import os, subprocess, sys, time;"
        "kid = subprocess.Popen(['sleep', '600']);"
        "open(sys.argv[1] + '.kid', 'a').write(f'{kid.pid}\\n');"
        "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
    )
    sup = subprocess.Popen(
        [str(SUPERVISE), str(log), sys.executable, "-c", child, str(pidfile)],
        stdin=subprocess.DEVNULL,
    )
    try:
        first = read_pid(pidfile)
        os.kill(first, signal.SIGKILL)  # the worker dies
        second = read_pid(pidfile, not_pid=first)
        assert "exited with status 137" in log.read_text() or "killed" in log.read_text()
        assert "restarting" in log.read_text()

        os.kill(second, signal.SIGKILL)  # and again: the wait doubles
        third = read_pid(pidfile, not_pid=second)
        lines = [line for line in log.read_text().splitlines() if "restarting" in line]
        assert len(lines) == 2 and "after 1 s" in lines[0] and "after 2 s" in lines[1], lines

        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=15) == 0
        deadline = time.monotonic() + 5
        while alive(third) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(third), "the supervised command outlived its supervisor"
        kids = [int(line) for line in Path(f"{pidfile}.kid").read_text().split()]
        assert len(kids) == 3 and not any(alive(k) for k in kids), "what it started lives on"
    finally:
        if sup.poll() is None:
            sup.kill()
        pids = [int(pidfile.read_text() or 0)] if pidfile.exists() else []
        kids = Path(f"{pidfile}.kid")
        pids += [int(line) for line in kids.read_text().split()] if kids.exists() else []
        for pid in pids:
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
