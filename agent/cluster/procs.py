"""Process helpers for the local cluster: is a pid still the same live process, signal a
process group, a free port, the environment and working directory of the processes the
cluster starts. Linux only (/proc). No torch, no Django."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

# The repository: the working directory and import path of every process the cluster starts.
REPO = Path(__file__).resolve().parents[2]


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a live process, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def alive(pid: int | None, start: int | None = None) -> bool:
    """Whether `pid` is the same process still running (a zombie is not; a reused pid is not)."""
    if not pid:
        return False
    st = proc_stat(pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    return start is None or st[1] == start


def proc_state(pid, start) -> str:
    st = proc_stat(pid) if pid else None
    if st is None or st[0] in ("Z", "X") or (start is not None and st[1] != start):
        return "gone"
    return "stopped" if st[0] in ("T", "t") else "running"


def signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def detach() -> None:
    """Forks: the parent (the launcher's child) exits, the child carries on."""
    if os.fork() > 0:
        os._exit(0)
