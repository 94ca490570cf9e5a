"""The launcher wrapper: `python -m agent.launch [options] -- <command...>` in front of
`torchrun ...`, `srun ...` or `python train.py`, reporting what the ranks cannot.

Long module: one small program read top to bottom (the exit and its reason, the
watch of launch.json and the workers, the sender, the wrapper), kept in one file
that runs with the standard library alone.

Standard library only (no torch, no Django). The ranks report their launches
themselves (`agent.init`); a launch that dies cannot say so, and a launcher that
restarts blindly cannot be told to stop. The wrapper:

- runs the command in a process group of its own with REBOUND_LAUNCH_STATE set to a
  fresh directory (`--state-dir`), where rank 0 keeps `launch.json`
  (`agent.launch_env.LaunchState`), and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (on
  gloo, torchrun cannot re-form a worker group whose rank died under a DDP comm hook
  with its shared store); SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 are forwarded to that
  group;
- watches `launch.json` and the command's own children (torchrun's workers): when a
  new launch appears while the one before had not ended (torchrun restarted the
  worker group after a rank died), it ends the one before `failed` at the time the
  first of its workers was seen gone (`data.exit_code`/`signal` when it caught the
  worker's status);
- when `launch.json` says the console refused the launch (`refused`: crash_loop,
  cluster_paused, job_finished), or the command exits EXIT_REFUSED (78), it stops
  the command's group at once (torchrun would restart it until --max-restarts),
  prints the console's detail, reports no crash and exits 78;
- at the command's final exit, ends the latest launch if the ranks did not
  (`attempt_ended`, `EXIT_REASONS` below), saying in `data` whether it had become
  ready and on which node the wrapper ran; with no `launch.json` at all the job never
  reached `agent.init()`: the wrapper reserves a launch number of its own and sends
  `attempt_started` and `attempt_ended` failed, `data.never_started` true (only on
  the job's first node: `first_node`).
- on a node without rank 0 (one wrapper per node of a multi-node job), `launch.json`
  says `reports: false`: the wrapper stops a refused launch as above, and leaves the
  ending of launches to rank 0's node.

The exit and its reason (`exit_reason`):

    the wrapper was sent SIGTERM      preempted   requested_by "scheduler" (Slurm's
                                                  preemption, scancel, time limit)
    the wrapper was sent SIGINT       killed      requested_by "<user> (SIGINT)": a person
                                                  stopped it; not a fault
    exit 0                            completed
    killed by SIGTERM (-15, 143)      preempted   requested_by "scheduler"
    killed by SIGKILL (-9, 137)       failed      signal SIGKILL; `oom` true when the
                                                  cgroup's oom_kill count rose meanwhile
    any other exit                    failed      exit_code, signal when one killed it

`data.exit_code` is the shell's code (128+N for a signal N) and `data.signal` its name.
The wrapper's events have ids stable per launch (the agent's own
`launch-<n>-<digest>-attempt_ended`), so a resend, or an end the ranks sent already,
is stored once. They are posted to `POST /api/v1/ingest` by a thread that asks a
console that is away again for `--report-retry-s`. The wrapper exits with the
command's exit code (128+N for a signal), or 78 for a refused launch.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import http.client
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from agent.launch_env import (
    EXIT_REFUSED,
    STATE_FILE,
    ConsoleAway,
    EnvError,
    LaunchRefused,
    _post,
    identity_digest,
    launch_identity,
    new_nonce,
    read_env,
    reserve,
)

INGEST_PATH = "/api/v1/ingest"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
STOP_GRACE_S = 10.0  # after SIGTERM to a refused launch's group, then SIGKILL
SCRIPT_SUFFIXES = (".py", ".sh", ".sbatch", ".slurm")


def _say(message: str) -> None:
    print(f"rebound launch: {message}", file=sys.stderr, flush=True)


def first_node(command: list[str], environ) -> bool:
    """Whether this wrapper runs on the job's first node, the one that reports a launch
    that never started: task 0's under `srun`; under a torchrun of several nodes only
    the one given `--node-rank 0` (with an elastic rendezvous no node knows it is
    first, so none says it); any other command runs on one node."""
    if "SLURM_PROCID" in environ:  # under srun (or in a batch script: task 0)
        return environ["SLURM_PROCID"] == "0"
    if not any(
        os.path.basename(a).startswith("torchrun") or a == "torch.distributed.run"
        for a in command[:4]
    ):
        return True
    options = {}
    for i, arg in enumerate(command):
        name, eq, value = arg.partition("=")
        if name in ("--nnodes", "--node-rank", "--node_rank"):
            options[name.replace("_", "-")] = value if eq else (command[i + 1 : i + 2] or [""])[0]
    most = options.get("--nnodes", "1").rpartition(":")[2]
    if not most.isdigit() or int(most) <= 1:
        return True
    return options.get("--node-rank") == "0"


# --- the exit and its reason -------------------------------------------------------------


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def split_exit(returncode: int) -> tuple[int, int | None]:
    """(the shell's exit code, the signal that killed the process or None) of a
    `Popen.returncode` (-N for a signal) or a shell's code (128+N)."""
    if returncode < 0:
        return 128 - returncode, -returncode
    if 128 < returncode < 128 + 65:
        return returncode, returncode - 128
    return returncode, None


def exit_reason(
    returncode: int,
    *,
    told: int | None = None,
    oom: bool = False,
    user: str | None = None,
) -> dict:
    """`attempt_ended`'s data for a launch whose command exited with `returncode`;
    `told` the signal the wrapper itself was sent (SIGTERM, SIGINT), if any; see the
    module docstring."""
    code, sig = split_exit(returncode)
    data: dict = {"exit_code": code}
    if sig is not None:
        data["signal"] = signal_name(sig)
    if told == signal.SIGINT:
        who = user or _user()
        return {"reason": "killed", "requested_by": f"{who} (SIGINT)"[:200], **data}
    if told == signal.SIGTERM or sig == signal.SIGTERM:
        return {"reason": "preempted", "requested_by": "scheduler", **data}
    if returncode == 0:
        return {"reason": "completed", **data}
    if oom:
        data["oom"] = True
        data["message"] = "killed by the kernel's OOM killer"
    elif sig == signal.SIGKILL:
        data["message"] = "killed by SIGKILL (the OOM killer, the scheduler or a person)"
    elif sig is not None:
        data["message"] = f"killed by {signal_name(sig)}"
    else:
        data["message"] = f"exited with code {code}"
    return {"reason": "failed", **data}


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "someone"


def cgroup_events(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> str:
    """This process's cgroup v2 `memory.events` file (where the kernel counts OOM kills)."""
    try:
        with open(proc_cgroup, encoding="ascii") as f:
            for line in f:
                if line.startswith("0::"):
                    return os.path.join(root, line[3:].strip().lstrip("/"), "memory.events")
    except OSError:
        pass
    return os.path.join(root, "memory.events")


def oom_kills(path: str | None = None) -> int | None:
    """The OOM kills in this cgroup so far (cgroup v2), or None where unknown."""
    try:
        with open(path or cgroup_events(), encoding="ascii") as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


# --- the command's children ----------------------------------------------------------------


def children(pid: int) -> set[int]:
    """The direct children of `pid` (torchrun's workers), from /proc."""
    out: set[int] = set()
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(OSError, ValueError),
                open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f,
            ):
                out.update(int(p) for p in f.read().split())
    return out


def zombie_status(pid: int) -> int | None:
    """The wait status of `pid` when it is a zombie its parent has not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] != "Z" or len(fields) < 50:
        return None
    try:
        return int(fields[49])  # field 52: exit_code, as waitpid reports it
    except ValueError:
        return None


# --- the launch state ----------------------------------------------------------------------


def read_launch(directory: str) -> dict | None:
    """`launch.json`, or None while there is none or it cannot be read (a launch
    state is replaced atomically, so a torn read is not expected; a stray file is)."""
    try:
        with open(os.path.join(directory, STATE_FILE), encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


@dataclass
class Watch:
    """What the wrapper learned of the launches from `launch.json` and the workers."""

    launches: list[dict] = field(default_factory=list)  # each state seen, latest last
    refused: dict | None = None
    death_ts: float | None = None  # the current launch's first worker seen gone
    death_status: int | None = None
    workers: set[int] = field(default_factory=set)

    @property
    def current(self) -> dict | None:
        return self.launches[-1] if self.launches else None

    def see(self, state: dict | None) -> dict | None:
        """Takes a read of `launch.json`; returns the launch it supersedes unended
        (a restart after a death), if any."""
        if state is None:
            return None
        if state.get("refused"):
            self.refused = state["refused"] if isinstance(state["refused"], dict) else {}
            return None
        if state.get("attempt") is None:
            return None
        current = self.current
        if current is not None and (current.get("attempt"), current.get("launch")) == (
            state.get("attempt"),
            state.get("launch"),
        ):
            self.launches[-1] = state
            return None
        self.launches.append(state)
        superseded = current if current is not None and not current.get("ended") else None
        death = (self.death_ts, self.death_status)
        self.death_ts = self.death_status = None
        if superseded is not None:
            superseded = {**superseded, "_death": death}
        return superseded

    def see_workers(self, now: set[int], at: float) -> None:
        """Notes when a worker of the current launch went away (before it ended)."""
        gone = self.workers - now
        for pid in gone:
            if self.death_status is None:
                self.death_status = zombie_status(pid)
        for pid in now & self.workers:
            status = zombie_status(pid)
            if status is not None:
                gone.add(pid)
                if self.death_status is None:
                    self.death_status = status
        current = self.current
        if gone and self.death_ts is None and not (current and current.get("ended")):
            self.death_ts = at
        self.workers = now


def status_data(status: int | None) -> dict:
    """`exit_code` and `signal` of a wait status, when known."""
    if status is None:
        return {}
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return {"exit_code": 128 + sig, "signal": signal_name(sig)}
    if os.WIFEXITED(status):
        return {"exit_code": os.WEXITSTATUS(status)}
    return {}


# --- reporting -----------------------------------------------------------------------------


def event_id(attempt: int, identity: str, kind: str) -> str:
    """The agent's id of a launch's once-only event (agent.auto.Launch.event_id)."""
    return f"launch-{attempt}-{identity_digest(identity)}-{kind}"


class Sender:
    """Posts the wrapper's events in order, from a thread, asking a console that is away
    again with backoff until `retry_s` after each event was queued."""

    def __init__(self, url: str, token: str, *, retry_s: float = 60.0, timeout_s: float = 5.0):
        self.url, self.token = url, token
        self.retry_s, self.timeout_s = retry_s, timeout_s
        self.queue: queue.Queue = queue.Queue()
        self.sent: list[dict] = []
        self.thread = threading.Thread(target=self._run, name="rebound-launch", daemon=True)
        self.thread.start()

    def send(self, events: list[dict]) -> None:
        self.queue.put((time.monotonic() + self.retry_s, events))

    def close(self, timeout_s: float | None = None) -> bool:
        """Waits for what was queued (at most `timeout_s`); whether all of it went."""
        self.queue.put(None)
        self.thread.join(self.retry_s + 10 if timeout_s is None else timeout_s)
        return not self.thread.is_alive() and self.queue.empty()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            deadline, events = item
            self._post(events, deadline)

    def _post(self, events: list[dict], deadline: float) -> None:
        delay = 0.5
        while True:
            try:
                status, answer, _ = _post(
                    self.url, self.token, {"events": events}, self.timeout_s, INGEST_PATH
                )
            except (OSError, http.client.HTTPException, ValueError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if status < 300:
                    self.sent.extend(events)
                    return
                problem = f"HTTP {status}: {json.dumps(answer)[:500]}"
                if status < 500 and status != 429:
                    _say(f"the console refused the wrapper's report ({problem})")
                    return
            if time.monotonic() + delay > deadline:
                kinds = ", ".join(e["kind"] for e in events)
                _say(f"could not report {kinds} to {self.url}: {problem}")
                return
            time.sleep(delay * (0.5 + random.random() / 2))
            delay = min(delay * 2, 8.0)


def _ts() -> float:
    return round(time.time(), 6)


# --- the wrapper ---------------------------------------------------------------------------


def guess_script(command: list[str]) -> str:
    """The script a command runs (what names the job when nothing else does)."""
    for arg in command[1:]:
        if not arg.startswith("-") and arg.endswith(SCRIPT_SUFFIXES):
            return arg
    return command[0] if command else "job"


class Launcher:
    """One run of a command under the wrapper; `run()` returns the exit code."""

    def __init__(
        self,
        command: list[str],
        *,
        state_dir: str | None = None,
        poll_s: float = 0.1,
        report_retry_s: float = 60.0,
        environ=None,
    ):
        self.command = command
        self.environ = dict(os.environ if environ is None else environ)
        self.own_state_dir = not state_dir  # a temporary one, removed at the end
        self.state_dir = state_dir or tempfile.mkdtemp(prefix="rebound-launch-")
        self.poll_s = poll_s
        self.started_at = time.time()
        self.watch = Watch()
        self.told: int | None = None
        self.child: subprocess.Popen | None = None
        try:
            self.env = read_env(self.environ, argv0=guess_script(command))
        except EnvError as exc:
            _say(f"{exc}; the wrapper reports nothing")
            self.env = None
        self.sender = (
            Sender(self.env.url, self.env.token, retry_s=report_retry_s)
            if self.env is not None and self.env.reporting
            else None
        )

    # signals
    def _forward(self, signum, _frame) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT) and self.told is None:
            self.told = signum
        if self.child is not None and self.child.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signum)

    def _child_env(self) -> dict:
        env = dict(self.environ)
        env["REBOUND_LAUNCH_STATE"] = self.state_dir
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        return env

    def run(self) -> int:
        os.makedirs(self.state_dir, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self.state_dir, STATE_FILE))  # a fresh launch state
        oom_before = oom_kills()
        previous = {s: signal.signal(s, self._forward) for s in FORWARDED}
        try:
            self.child = subprocess.Popen(
                self.command, env=self._child_env(), start_new_session=True
            )
        except OSError as exc:
            for s, handler in previous.items():
                signal.signal(s, handler)
            _say(f"cannot run {self.command[0]!r}: {exc}")
            return 127
        try:
            returncode = self._supervise()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        oom_after = oom_kills()
        oom = oom_before is not None and oom_after is not None and oom_after > oom_before
        try:
            return self._finish(returncode, oom=oom)
        finally:
            if self.own_state_dir:
                shutil.rmtree(self.state_dir, ignore_errors=True)

    def _supervise(self) -> int:
        child = self.child
        stop_at = None  # when a refused launch's group gets SIGKILL
        while True:
            returncode = child.poll()
            now = time.time()
            self.watch.see_workers(children(child.pid), now)
            superseded = self.watch.see(read_launch(self.state_dir))
            if superseded is not None:
                self._end_superseded(superseded, now)
            if returncode is not None:
                # A last look: the ranks may have written launch.json just before.
                self.watch.see(read_launch(self.state_dir))
                return returncode
            if self.watch.refused is not None and stop_at is None:
                self._say_refused()
                _say(f"stopping {self.command[0]}: no restart until the console allows it")
                self._signal_group(signal.SIGTERM)
                stop_at = time.monotonic() + STOP_GRACE_S
            if stop_at is not None and time.monotonic() > stop_at:
                self._signal_group(signal.SIGKILL)
                stop_at = float("inf")
            time.sleep(self.poll_s)

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, signum)
        if signum == signal.SIGKILL:  # torchrun's workers run in sessions of their own
            for pid in self.watch.workers:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def _say_refused(self) -> None:
        refused = self.watch.refused or {}
        code = refused.get("code") or "refused"
        detail = refused.get("detail") or "the console refused the launch"
        _say(f"the console refused a new launch ({code}): {detail}")

    def _send(self, events: list[dict]) -> None:
        if self.sender is not None:
            self.sender.send(events)

    def _end_event(self, launch: dict, data: dict, ts: float) -> dict:
        return {
            "id": event_id(launch["attempt"], str(launch.get("launch") or ""), "attempt_ended"),
            "job": launch.get("job") or self.env.job,
            "kind": "attempt_ended",
            "ts": ts,
            "attempt": launch["attempt"],
            "node": self.env.node,
            "rank": 0,
            "data": data,
        }

    def _common(self, launch: dict) -> dict:
        data = {
            "node": self.env.node,
            "launcher": "agent.launch",
            "ready": bool(launch.get("ready")),
        }
        if not launch.get("ready"):
            data["never_ready"] = True
        return data

    def _end_superseded(self, launch: dict, now: float) -> None:
        """A launch that a restart replaced before it ended: a rank died."""
        if self.env is None or launch.get("reports") is False:
            return  # rank 0's node ends it
        death_ts, status = launch.get("_death") or (None, None)
        data = {
            "reason": "failed",
            **self._common(launch),
            **status_data(status),
            "message": f"a rank died; {os.path.basename(self.command[0])} restarted the workers",
        }
        if not launch.get("ready"):
            data["message"] += " (the launch never became ready)"
        self._send([self._end_event(launch, data, round(death_ts or now, 6))])

    def _death(self) -> tuple[float | None, int | None]:
        return self.watch.death_ts, self.watch.death_status

    def _finish(self, returncode: int, *, oom: bool) -> int:
        code, _ = split_exit(returncode)
        refused = self.watch.refused is not None or returncode == EXIT_REFUSED
        if refused:
            if self.watch.refused is None:
                _say("the console refused the launch (exit 78); see the ranks' output above")
            else:
                self._say_refused()
            _say(f"{self.command[0]} exited with code {code}; the wrapper exits {EXIT_REFUSED}")
            current = self.watch.current
            if self.env is not None and current is not None and not current.get("ended"):
                # The launch before the refused one died (that is why a restart came).
                self._end_superseded({**current, "_death": self._death()}, time.time())
            self._close()
            return EXIT_REFUSED
        if self.env is not None:
            current = self.watch.current
            end = exit_reason(returncode, told=self.told, oom=oom)
            if current is None:
                self._never_started(end)
            elif not current.get("ended") and current.get("reports") is not False:
                ts = self.watch.death_ts if end["reason"] == "failed" else None
                data = {**end, **self._common(current)}
                if not current.get("ready"):
                    data["message"] = data.get("message", end["reason"]) + (
                        "; the launch never became ready"
                    )
                self._send([self._end_event(current, data, round(ts or time.time(), 6))])
        self._close()
        return code

    def _never_started(self, end: dict) -> None:
        """No launch.json: the job never reached agent.init(); a launch of the wrapper's
        own says so, so that the console sees the attempt and why it failed."""
        if self.sender is None:
            return
        if not first_node(self.command, self.environ):
            _say("no launch started on this node; the first node's wrapper reports the job's")
            return
        identity = f"launcher:{self.env.node}/" + launch_identity(self.env, new_nonce())
        identity = identity[-200:]
        try:
            got = reserve(self.env.url, self.env.token, self.env.job, identity, retry_s=20)
        except LaunchRefused as exc:
            _say(f"the console refused a launch of the wrapper's own ({exc.code}): {exc.detail}")
            return
        except (ConsoleAway, ValueError) as exc:
            _say(f"could not report that the job never started: {exc}")
            return
        launch = {"job": self.env.job, "attempt": got.attempt, "launch": identity}
        started = {
            "id": event_id(got.attempt, identity, "attempt_started"),
            "job": self.env.job,
            "kind": "attempt_started",
            "ts": round(self.started_at, 6),
            "attempt": got.attempt,
            "node": self.env.node,
            "rank": 0,
            "data": {
                "world_size": self.env.world_size,
                "nodes": [self.env.node],
                "launch": identity,
                "launcher": "agent.launch",
            },
        }
        if end["reason"] in ("completed", "failed"):
            end = {**end, "reason": "failed"}
            end["message"] = "never started: the job exited before agent.init() " + (
                f"({end.get('message') or 'exit 0'})"
            )
        data = {**end, "never_started": True, "node": self.env.node, "launcher": "agent.launch"}
        self._send([started, self._end_event(launch, data, _ts())])

    def _close(self) -> None:
        if self.sender is not None and not self.sender.close():
            _say("gave up reporting: the console stayed away")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agent.launch",
        description="Runs a training launcher (torchrun, srun, python) and reports to the"
        " Rebound console what its ranks cannot: the launch's exit and its reason, a launch"
        " that never became ready or never started; stops restarts the console refuses.",
    )
    parser.add_argument(
        "--state-dir", help="where rank 0 keeps launch.json (default: a new temporary directory)"
    )
    parser.add_argument(
        "--poll-s",
        type=float,
        default=0.1,
        help="how often launch.json and the workers are looked at (default 0.1 s)",
    )
    parser.add_argument(
        "--report-retry-s",
        type=float,
        default=60.0,
        help="how long a console that is away is asked again (default 60 s)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --: python -m agent.launch -- torchrun ... train.py")
    launcher = Launcher(
        command,
        state_dir=args.state_dir,
        poll_s=args.poll_s,
        report_retry_s=args.report_retry_s,
    )
    return launcher.run()


if __name__ == "__main__":
    sys.exit(main())
