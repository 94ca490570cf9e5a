"""A real single-host Slurm for tests: munged, slurmctld and several emulated
nodes (one `slurmd -N nodeX` each, on its own port), all under one directory.

    with SlurmCluster(tmp_dir, nodes=4) as cluster:
        cluster.env            # {"SLURM_CONF": ...} for the CLI
        cluster.run("sinfo", "-N")

Everything lives under `base`: slurm.conf (used through SLURM_CONF, nothing in
/etc/slurm), cgroup.conf, a munge key and munged's socket (a munged of our own,
so a system one is neither needed nor touched), state, spool, logs, pid files
and job output (`base/out`). Ports are free ones picked at start, so two
clusters on one machine do not meet.

Knobs (see ../shared/reference/remediation-slurm-alertmanager.md, section 2):
`AuthInfo=cred_expire=10` (a requeued job may start again after ~11 s instead
of ~121 s), `ReturnToService=1`, proctrack/linuxproc and task/none (no cgroups,
no systemd), no accounting (no slurmdbd; `sacct` does not work).

Stop: every job is cancelled, then each daemon is stopped by its pid file
(slurmd's, slurmctld's, munged's) and waited for; a daemon that does not stop
on SIGTERM gets SIGKILL. Nothing started here outlives `stop()`.

Needs root and Debian's `slurmctld slurmd slurm-client munge`; `missing()` says
what is absent, for a test to skip on (or fail, where REBOUND_REQUIRE_SLURM is set).
Run by hand: `python -m tests.slurm_cluster DIR` starts one and waits for Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sinfo", "squeue", "scontrol", "sbatch", "scancel")
SBIN = ("/usr/sbin", "/sbin")


class SlurmClusterError(RuntimeError):
    pass


def which(name: str) -> str | None:
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(SBIN)
    return shutil.which(name, path=path)


def missing() -> str | None:
    """Why a cluster cannot start here (None: it can)."""
    absent = [b for b in BINARIES if which(b) is None]
    if absent:
        return (
            f"Slurm is not installed ({', '.join(absent)} missing): "
            "apt-get install slurmctld slurmd slurm-client munge"
        )
    if os.geteuid() != 0:
        return "a test Slurm needs root (slurmd runs jobs as their users)"
    return None


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now (bound at once, so all differ)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class SlurmCluster:
    def __init__(
        self,
        base: str | os.PathLike,
        *,
        nodes: int = 4,
        cpus: int = 2,
        partition: str = "batch",
        cred_expire: int = 10,
        slurmd_timeout: int = 20,
        prolog: str | os.PathLike | None = None,
        epilog: str | os.PathLike | None = None,
        prolog_flags: str | None = None,
    ):
        self.base = Path(base).resolve()
        self.node_names = [f"node{i}" for i in range(1, nodes + 1)]
        self.cpus = cpus
        self.partition = partition
        self.cred_expire = cred_expire
        self.slurmd_timeout = slurmd_timeout
        self.prolog = prolog
        self.epilog = epilog
        self.prolog_flags = prolog_flags
        self.conf = self.base / "slurm.conf"
        self.run_dir = self.base / "run"
        self.log_dir = self.base / "log"
        self.out_dir = self.base / "out"
        self.munge_socket = self.run_dir / "munge.socket"
        self.started = False

    # paths and environment

    @property
    def env(self) -> dict[str, str]:
        """What a CLI call needs on top of the process's environment."""
        return {"SLURM_CONF": str(self.conf)}

    def pid_files(self) -> list[Path]:
        """Every daemon's pid file, in stopping order (nodes, controller, munge)."""
        nodes = [self.run_dir / f"slurmd-{n}.pid" for n in self.node_names]
        return [*nodes, self.run_dir / "slurmctld.pid", self.run_dir / "munged.pid"]

    def run(self, *args: str, timeout: float = 30, check: bool = True) -> str:
        """A Slurm command against this cluster; its stdout."""
        cmd = [which(args[0]) or args[0], *args[1:]]
        proc = subprocess.run(
            cmd,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise SlurmClusterError(f"{' '.join(args)}: {proc.stderr.strip() or proc.stdout}")
        return proc.stdout

    # start

    def write_config(self) -> None:
        for d in ("state", "log", "run", "out", "munge"):
            (self.base / d).mkdir(parents=True, exist_ok=True)
        for n in self.node_names:
            (self.base / "spool" / n).mkdir(parents=True, exist_ok=True)
        key = self.base / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        (self.base / "munge").chmod(0o700)
        ctld_port, *node_ports = free_ports(1 + len(self.node_names))
        self.ctld_port = ctld_port
        host = socket.gethostname().split(".")[0]
        b = self.base
        hooks = "".join(
            f"{name}={value}\n"
            for name, value in (
                ("Prolog", self.prolog),
                ("Epilog", self.epilog),
                ("PrologFlags", self.prolog_flags),
            )
            if value
        )
        if hooks:
            # A node whose prolog or epilog hangs is drained after this long.
            hooks += "PrologEpilogTimeout=30\n"
        node_lines = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={self.cpus} RealMemory=1000 State=UNKNOWN"
            for n, port in zip(self.node_names, node_ports, strict=True)
        )
        self.conf.write_text(
            f"""\
# Written by tests/slurm_cluster.py for a throwaway test cluster.
ClusterName=rebound-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire={self.cred_expire},socket={self.munge_socket}
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool/%n
SlurmctldPidFile={b}/run/slurmctld.pid
SlurmdPidFile={b}/run/slurmd-%n.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=1
SlurmdTimeout={self.slurmd_timeout}
JobRequeue=1
MinJobAge=600
KillWait=2
InactiveLimit=0
{hooks}{node_lines}
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )
        # No cgroups here: the plugins above do not use them; this only keeps slurmd
        # from looking for a system cgroup.conf.
        (self.base / "cgroup.conf").write_text(
            "CgroupAutomount=no\nConstrainCores=no\nConstrainRAMSpace=no\n"
        )

    def _spawn(self, *args: str) -> None:
        """Start a daemon that forks into the background; wait for the parent to return."""
        cmd = [which(args[0]) or args[0], *args[1:]]
        proc = subprocess.run(
            cmd,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=30,
            cwd=self.base,
        )
        if proc.returncode != 0:
            raise SlurmClusterError(
                f"{' '.join(args)} did not start: {proc.stderr.strip() or proc.stdout}"
                f"\n{self.logs()}"
            )

    def start(self, timeout: float = 30) -> SlurmCluster:
        why = missing()
        if why:
            raise SlurmClusterError(why)
        self.write_config()
        self.started = True  # from here on, stop() has something to do
        try:
            self._spawn(
                "munged",
                f"--socket={self.munge_socket}",
                f"--key-file={self.base / 'munge' / 'munge.key'}",
                f"--pid-file={self.run_dir / 'munged.pid'}",
                f"--log-file={self.log_dir / 'munged.log'}",
                f"--seed-file={self.base / 'munge' / 'munged.seed'}",
                "--force",
            )
            self._wait_file(self.munge_socket, timeout)
            self._spawn("slurmctld", "-i")
            self._wait(lambda: self.run("scontrol", "ping", check=False).count("UP"), timeout)
            for n in self.node_names:
                self._spawn("slurmd", "-N", n)
            self.wait_idle(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_idle(self, nodes: list[str] | None = None, timeout: float = 30) -> None:
        want = set(nodes or self.node_names)

        def idle():
            out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
            states = dict(line.split() for line in out.splitlines() if line.strip())
            return all(states.get(n) == "idle" for n in want)

        self._wait(idle, timeout, what=f"nodes {sorted(want)} idle")

    def reset(self, timeout: float = 30) -> None:
        """Back to a clean cluster between tests: no job, no reservation, every node
        resumed and idle."""
        self.cancel_all()
        out = self.run("scontrol", "-o", "show", "reservation", check=False)
        for name in re.findall(r"ReservationName=(\S+)", out):
            self.run("scontrol", "delete", f"reservation={name}", check=False)
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        for line in out.splitlines():
            node, _, state = line.partition(" ")
            if state.strip() != "idle":
                self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        self.wait_idle(timeout=timeout)

    def _wait_file(self, path: Path, timeout: float) -> None:
        self._wait(path.exists, timeout, what=str(path))

    def _wait(self, ready, timeout: float, what: str = "the cluster") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if ready():
                    return
            except (subprocess.TimeoutExpired, SlurmClusterError, ValueError):
                pass
            time.sleep(0.2)
        raise SlurmClusterError(f"timed out waiting for {what}\n{self.logs()}")

    # stop

    def cancel_all(self, timeout: float = 15) -> None:
        """Cancel every job and wait until none is left running on a node."""
        self.run("scancel", "--user=root", check=False, timeout=10)

        def none_left():
            out = self.run("squeue", "-h", "-t", "all", "-o", "%T", check=False, timeout=10)
            return not any(
                s in ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "PENDING")
                for s in out.split()
            )

        with contextlib.suppress(SlurmClusterError):
            self._wait(none_left, timeout, what="jobs to end")

    def stop(self) -> None:
        """Cancel jobs, then stop every daemon by its pid file and wait for it."""
        if not self.started:
            return
        if (self.run_dir / "slurmctld.pid").exists():
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self.cancel_all()
        for path in self.pid_files():
            self._kill(path)
        self.started = False

    @staticmethod
    def _kill(pid_file: Path, timeout: float = 10) -> None:
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def running_daemons(self) -> list[int]:
        """Pids from our pid files that are still alive (after stop(): none)."""
        pids = []
        for path in self.pid_files():
            try:
                pid = int(path.read_text().strip())
            except (OSError, ValueError):
                continue
            if _alive(pid):
                pids.append(pid)
        return pids

    def logs(self, tail: int = 20) -> str:
        out = []
        for path in sorted(self.log_dir.glob("*.log")) if self.log_dir.exists() else []:
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            out.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(out)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    import sys
    import tempfile

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # `kill PID` stops the daemons too
    base = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="slurm-")
    with SlurmCluster(base) as c:
        print(f"export SLURM_CONF={c.conf}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
