"""Slurm's prolog and epilog on a node: what the node knows of a job, reported to Rebound.

    python -m agent.slurm_node prolog     # slurm.conf: Prolog=.../agent/slurm/prolog.sh
    python -m agent.slurm_node epilog     # slurm.conf: Epilog=.../agent/slurm/epilog.sh

Standard library only. slurmd runs both as root on every node of a job (with
`PrologFlags=Alloc`, at the allocation; without it, where the job's first step starts),
with SLURM_JOB_ID, SLURMD_NODENAME, SLURM_JOB_USER, SLURM_JOB_RESTART_COUNT, ... in a
bare environment (no PATH; Slurm 22.05 gives no SLURM_JOB_NAME: the name comes from
`scontrol show job`). Through the ingest API (wire format v1, nothing new on the wire)
they send, for the job named as the agent names it (the job name, made a key):

- prolog: a `heartbeat` of the node, `data.slurm = {"hook": "prolog", "job_id",
  "restart_count", "user", "partition"}`: the node is up and the job starts there;
- epilog: a `heartbeat` likewise (`"hook": "epilog"`, and the job's `exit_code`
  "code:signal"), and, when the node is draining, drained, down or failed with a reason
  that Rebound did not set (Rebound's slurm driver starts its reasons with `rebound:`),
  a `fault` of the node: `type` gpu_xid (with `xid`) when the reason names an Xid, ecc
  when it says ECC, else other; `message` "Slurm drained node N: <reason>"; and
  `data.slurm` with the node's `state`, `reason`, and who set it (`reason_by`).

They never fail the job (a failing prolog drains the node and requeues the job): every
error is logged (stderr, syslog, and REBOUND_HOOK_LOG when set) and the exit status is
0; the whole run, `scontrol` and the console included, stays within REBOUND_HOOK_TIMEOUT_S.

Configuration: /etc/rebound/node.env (REBOUND_NODE_ENV names another file), root-only,
`KEY=VALUE` lines (`#` comments, optional quotes, `export ` allowed); a variable set in
the environment wins over the file:

    REBOUND_URL             the console (unset: the hooks report nothing)
    REBOUND_TOKEN           an ingest token of the cluster, or REBOUND_TOKEN_FILE
    REBOUND_SLURM_JOBS      a regular expression: only jobs whose key it finds are
                            reported (default: every job)
    REBOUND_HOOK_TIMEOUT_S  the most a hook takes, in seconds (default 5, at most 15:
                            the shell scripts kill a run at 20 s)
    REBOUND_HOOK_LOG        a file each hook appends one line to (default: none)
    REBOUND_PYTHON          the python the shell scripts run (read by them, not here)
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

from agent.launch_env import job_key_from
from common.vocabulary import JOB_KEY, NODE_NAME

CONFIG_FILE = "/etc/rebound/node.env"
INGEST_PATH = "/api/v1/ingest"
DEFAULT_TIMEOUT_S = 5.0
MAX_TIMEOUT_S = 15.0
HOOKS = ("prolog", "epilog")
# Rebound's own drain reasons (recovery/drivers/slurm/parse.py: PREFIX; the agent imports
# no app, tests/agent/test_slurm_node.py keeps the two equal).
REBOUND_MARK = "rebound:"
# Node state flags that take a node out of service, as `scontrol show node` writes them.
OUT_OF_SERVICE = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING"})
SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Hook:
    """One run of a hook: its configuration, its deadline and its log."""

    def __init__(self, name: str, environ, *, clock=time.monotonic):
        self.name = name
        self.environ = environ
        self.clock = clock
        self.started = clock()
        self.config: dict[str, str] = {}
        self.timeout_s = DEFAULT_TIMEOUT_S
        self.context = f"rebound slurm {name}"

    def remaining(self) -> float:
        return self.timeout_s - (self.clock() - self.started)

    def log(self, message: str) -> None:
        line = f"{self.context}: {message}"
        with contextlib.suppress(Exception):
            print(line, file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            import syslog

            syslog.openlog("rebound-slurm", 0, syslog.LOG_DAEMON)
            syslog.syslog(syslog.LOG_NOTICE, line)
        path = self.config.get("REBOUND_HOOK_LOG")
        if path:
            with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as f:
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")


# --- configuration --------------------------------------------------------------------


def read_env_file(path: str) -> dict[str, str]:
    """`KEY=VALUE` lines of `path` ({} when there is no such file)."""
    out = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def load_config(environ) -> dict[str, str]:
    """The node's file, then the environment's REBOUND_* over it."""
    path = environ.get("REBOUND_NODE_ENV") or CONFIG_FILE
    config = read_env_file(path)
    config.update({k: v for k, v in environ.items() if k.startswith("REBOUND_")})
    return config


def token_of(config: dict[str, str]) -> str | None:
    token = config.get("REBOUND_TOKEN") or None
    if not token and config.get("REBOUND_TOKEN_FILE"):
        with open(config["REBOUND_TOKEN_FILE"], encoding="utf-8") as f:
            token = f.read().strip() or None
    return token


# --- what Slurm says --------------------------------------------------------------------


def scontrol(hook: Hook, *args: str, timeout_s: float = 3.0) -> str | None:
    """`scontrol -o show ...`'s one line, or None (logged) when it cannot say in time."""
    exe = shutil.which("scontrol", path=hook.environ.get("PATH") or SEARCH_PATH)
    if exe is None:
        hook.log("scontrol not found")
        return None
    budget = min(timeout_s, hook.remaining() - 1.0)
    if budget <= 0:
        return None
    try:
        done = subprocess.run(
            [exe, "-o", *args],
            capture_output=True,
            text=True,
            timeout=budget,
            env={**hook.environ, "PATH": hook.environ.get("PATH") or SEARCH_PATH},
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        hook.log(f"scontrol {' '.join(args)}: {exc}")
        return None
    if done.returncode != 0:
        hook.log(f"scontrol {' '.join(args)}: {(done.stderr or done.stdout).strip()[:300]}")
        return None
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else None


def field(line: str, key: str, next_key: str | None = None) -> str | None:
    """`key`'s value in a `scontrol -o show` line: up to `next_key=` when given (values
    such as a job name hold spaces), else to the line's end for `Reason` (the last field
    of a node), else one word."""
    if next_key:
        m = re.search(rf"(?:^|\s){key}=(.*?)\s+{next_key}=", line)
    elif key == "Reason":
        m = re.search(r"(?:^|\s)Reason=(.*)$", line)
    else:
        m = re.search(rf"(?:^|\s){key}=(\S*)", line)
    return m.group(1) if m else None


def job_name(hook: Hook, job_id: str) -> str | None:
    """The job's name: SLURM_JOB_NAME where Slurm sets it, else `scontrol show job`."""
    name = hook.environ.get("SLURM_JOB_NAME")
    if name:
        return name
    line = scontrol(hook, "show", "job", job_id)
    return field(line, "JobName", "UserId") if line else None


def job_key(name: str) -> str:
    """The key the agent gives a job of this name (agent.launch_env.read_env)."""
    return name if JOB_KEY.match(name) else job_key_from(name)


def node_out_of_service(hook: Hook, node: str) -> dict | None:
    """The node's state and reason when it is draining, drained, down or failed; None
    when it is in service (or scontrol cannot say)."""
    line = scontrol(hook, "show", "node", node)
    if not line:
        return None
    state = field(line, "State") or ""
    if not OUT_OF_SERVICE & set(state.upper().replace("*", "").split("+")):
        return None
    raw = (field(line, "Reason") or "").strip()
    by = None
    m = re.match(r"(.*?)\s*\[([^\]]*)\]$", raw)
    if m:
        raw, by = m.group(1).strip(), m.group(2)
    return {"state": state, "reason": raw if raw not in ("", "(null)", "none") else None, "by": by}


def fault_of(reason: str) -> dict:
    """The fault type (and Xid) a drain reason points to."""
    m = re.search(r"\bxid\D{0,3}(\d{1,5})\b", reason, re.IGNORECASE)
    if m:
        return {"type": "gpu_xid", "xid": int(m.group(1))}
    if re.search(r"\becc\b", reason, re.IGNORECASE):
        return {"type": "ecc"}
    return {"type": "other"}


# --- the events and their sending --------------------------------------------------------


def events_for(hook: Hook, *, key: str, node: str, job_id: str, now: float) -> list[dict]:
    env = hook.environ
    restarts = env.get("SLURM_JOB_RESTART_COUNT") or env.get("SLURM_RESTART_COUNT") or "0"
    slurm = {"hook": hook.name, "job_id": job_id, "restart_count": int(restarts)}
    for name, var in (("user", "SLURM_JOB_USER"), ("partition", "SLURM_JOB_PARTITION")):
        if env.get(var):
            slurm[name] = env[var]
    if hook.name == "epilog" and env.get("SLURM_JOB_EXIT_CODE2"):
        slurm["exit_code"] = env["SLURM_JOB_EXIT_CODE2"]
    base = f"slurm-{job_id}-r{restarts}-{node}-{hook.name}-{int(now * 1000):x}"
    events = [
        {
            "id": f"{base}-heartbeat",
            "job": key,
            "kind": "heartbeat",
            "ts": now,
            "node": node,
            "data": {"slurm": slurm},
        }
    ]
    if hook.name == "epilog":
        out = node_out_of_service(hook, node)
        if out and out["reason"] and not out["reason"].startswith(REBOUND_MARK):
            events.append(
                {
                    "id": f"{base}-drained",
                    "job": key,
                    "kind": "fault",
                    "ts": now,
                    "node": node,
                    "data": {
                        **fault_of(out["reason"]),
                        "message": f"Slurm drained node {node}: {out['reason']}"[:1000],
                        "slurm": {
                            **slurm,
                            "state": out["state"],
                            "reason": out["reason"],
                            "reason_by": out["by"],
                        },
                    },
                }
            )
    return events


def post(url: str, token: str, events: list[dict], remaining) -> tuple[int, str]:
    """POST the events to the console's ingest within `remaining()` seconds (connecting
    and answering together); (status, the answer's first 300 characters)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"REBOUND_URL must be http(s)://host[:port][/prefix], not {url!r}")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.netloc.rpartition("@")[2], timeout=max(0.1, remaining()))
    try:
        conn.connect()
        conn.sock.settimeout(max(0.1, remaining()))  # what connecting left of the budget
        conn.request(
            "POST",
            parts.path.rstrip("/") + INGEST_PATH,
            body=json.dumps({"events": events}),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "User-Agent": "rebound-slurm-hook/1",
            },
        )
        response = conn.getresponse()
        return response.status, response.read(4096).decode("utf-8", "replace")[:300]
    finally:
        conn.close()


def run(hook: Hook) -> str:
    """The hook's work; what it did, in words (for the log). Raises on what went wrong."""
    config = hook.config
    env = hook.environ
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    hook.context = f"rebound slurm {hook.name} job {job_id} node {node}"
    url = config.get("REBOUND_URL")
    if not url:
        return "REBOUND_URL is not set: nothing reported"
    token = token_of(config)
    if not token:
        return "neither REBOUND_TOKEN nor REBOUND_TOKEN_FILE is set: nothing reported"
    if not job_id:
        return "no SLURM_JOB_ID: not run by slurmd; nothing reported"
    if not NODE_NAME.match(node):
        return f"node name {node!r} is not one Rebound takes: nothing reported"
    name = job_name(hook, job_id)
    if not name:
        return "the job's name is unknown: nothing reported"
    key = job_key(name)
    wanted = config.get("REBOUND_SLURM_JOBS")
    if wanted and not re.search(wanted, key):
        return f"job {key} is not one REBOUND_SLURM_JOBS={wanted!r} reports"
    events = events_for(hook, key=key, node=node, job_id=job_id, now=time.time())
    if hook.remaining() <= 0.2:
        return f"out of time before reaching the console ({hook.timeout_s:g} s)"
    status, answer = post(url, token, events, hook.remaining)
    kinds = ", ".join(e["kind"] for e in events)
    if status in (200, 201, 202):
        return f"job {key}: sent {kinds}"
    return f"job {key}: the console answered {status} to {kinds}: {answer}"


def main(argv=None, environ=None) -> int:
    """Runs the hook named in argv; 0 whatever happens (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0] if argv and argv[0] in HOOKS else "hook"
    hook = Hook(name, os.environ if environ is None else environ)
    try:
        hook.config = load_config(hook.environ)
        with contextlib.suppress(ValueError):
            timeout_s = float(hook.config.get("REBOUND_HOOK_TIMEOUT_S") or DEFAULT_TIMEOUT_S)
            hook.timeout_s = min(max(0.5, timeout_s), MAX_TIMEOUT_S)
        if hook.name not in HOOKS:
            raise ValueError(f"usage: python -m agent.slurm_node {{{','.join(HOOKS)}}}")
        done = run(hook)
    except Exception as exc:  # the job must never pay for the hook
        done = f"failed ({type(exc).__name__}: {exc})"
    hook.log(f"{done} in {time.monotonic() - hook.started:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
