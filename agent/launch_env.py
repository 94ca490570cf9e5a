"""What a launch learns from its environment, and the number the console hands it.

Standard library only (no torch, no Django): the zero-config agent (`agent.auto`) and
the launcher wrapper read the same things here.

The environment (`read_env`):

    REBOUND_URL           the console (unset: the job trains and reports nothing)
    REBOUND_TOKEN         an ingest token, or REBOUND_TOKEN_FILE: a file holding it
    REBOUND_JOB           the job's key; default SLURM_JOB_NAME, else the script's name
                          (without .py); made a valid key (other characters become '-')
    REBOUND_NODE          this host's name in the console; default SLURMD_NODENAME (the
                          Slurm node's name, as the prolog and epilog report it, see
                          agent.slurm_node), else the host name
    REBOUND_HEARTBEAT_S   seconds between a node's heartbeats (default 10; 0: none)
    REBOUND_LAUNCH_STATE  a directory: local rank 0 keeps <dir>/launch.json there (below)
    REBOUND_LAUNCH_RETRY_S  how long rank 0 keeps asking a console that is away for
                          the launch number before it trains unreported (default 60)
    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE   torchrun's; under a bare `srun`
                          SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and
                          SLURM_NTASKS_PER_NODE stand in; LOCAL_WORLD_SIZE is the GPUs
                          per node reported
    TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, SLURM_JOB_ID,
    SLURM_RESTART_COUNT, SLURM_JOB_NODELIST          the launcher's ids

The launch identity (`launch_identity`): the launcher's ids present (`te:<run id>:r<torchrun
restart count>`, `slurm:<job id>:r<requeue count>`) and a nonce rank 0 draws at start
(`n:<16 hex>`), joined with '/': `te:5f0c…:r1/slurm:4242:r0/n:9f2c…`. The nonce makes
every launch new, so a torchrun restart, a Slurm requeue, a resubmission under the same
job name or a restart of anything never repeats an identity (torchrun's default run id
is "none" for every launch); the launcher's ids make it readable.

The launch number (`reserve`): `POST /api/v1/launches {"job", "launch"}` answers
`{"job", "attempt", "launch", "created"}` (201 new, 200 the identity had it already).
A console that is away (no connection, 5xx, 429) is asked again with backoff for
REBOUND_LAUNCH_RETRY_S; then `reserve` returns None and the job trains unreported,
which it says once on stderr. A 409 is the console's gate refusing a new launch
(`LaunchRefused`: `code` job_finished, cluster_paused or crash_loop, `detail` what to
do); the agent prints the detail and exits the process with EXIT_REFUSED, so that a
launcher stops rather than restarts blindly.

The launch state (`LaunchState`, when REBOUND_LAUNCH_STATE is set): the process with
local rank 0 of each node keeps `<dir>/launch.json`, replaced atomically at the number
and, on rank 0's node, at ready and at the end:

    {"job": "llm-7b", "attempt": 4, "launch": "te:…/n:…", "ready": false, "ended": false,
     "reports": true}

`reports` is false on the other nodes: their wrappers learn that the launch started (or
was refused) and leave its ending to rank 0's. When the console refused the launch,
`"refused": {"code": ..., "detail": ...}` (with `attempt` null): what a launcher wrapper
reads to tell a refusal from a crash.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import random
import re
import secrets
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from common.vocabulary import JOB_KEY

# The process exit code of a launch the console refused (job finished, cluster paused,
# crash loop): distinct from a crash's, so a launcher stops instead of restarting.
EXIT_REFUSED = 78  # sysexits' EX_CONFIG: this launch should not run as configured
DEFAULT_HEARTBEAT_S = 10.0
DEFAULT_RETRY_S = 60.0
LAUNCHES_PATH = "/api/v1/launches"
STATE_FILE = "launch.json"
IDENTITY_MAX = 200
_ID_PART_MAX = 64


class EnvError(ValueError):
    """A variable of the environment that cannot be read (RANK=x, a missing token file)."""


def _int(environ, *names: str, default: int | None = None) -> int | None:
    for name in names:
        value = environ.get(name)
        if value in (None, ""):
            continue
        match = re.match(r"\s*(\d+)", value)  # SLURM_NTASKS_PER_NODE may read "8(x2)"
        if match is None:
            raise EnvError(f"{name}={value!r} is not a whole number")
        return int(match.group(1))
    return default


def job_key_from(name: str) -> str:
    """`name` as a job key: known suffixes dropped, other characters made '-'."""
    name = os.path.basename(name.strip())
    for suffix in (".py", ".sh", ".sbatch", ".slurm"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    key = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:100]
    return key or "job"


@dataclass(frozen=True)
class LaunchEnv:
    url: str | None
    token: str | None
    job: str
    node: str
    heartbeat_s: float
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None
    torchelastic_run_id: str | None = None
    torchelastic_restart_count: int | None = None
    slurm_job_id: str | None = None
    slurm_restart_count: int | None = None
    slurm_nodelist: str | None = None
    state_dir: str | None = None
    retry_s: float = DEFAULT_RETRY_S

    @property
    def reporting(self) -> bool:
        """Whether there is a console to report to."""
        return bool(self.url and self.token)

    def launcher(self) -> dict:
        """The launcher's ids present, for `attempt_started`'s data."""
        out = {}
        if self.torchelastic_run_id is not None:
            out["torchelastic"] = {
                "run_id": self.torchelastic_run_id,
                "restart_count": self.torchelastic_restart_count or 0,
            }
        if self.slurm_job_id is not None:
            slurm = {"job_id": self.slurm_job_id, "restart_count": self.slurm_restart_count or 0}
            if self.slurm_nodelist:
                slurm["nodelist"] = self.slurm_nodelist
            out["slurm"] = slurm
        return out


def read_env(environ=None, *, argv0: str | None = None) -> LaunchEnv:
    """The launch's environment (see the module docstring); `EnvError` for what cannot be
    read. `argv0` (default sys.argv[0]) names the job when nothing else does."""
    env = os.environ if environ is None else environ
    token = env.get("REBOUND_TOKEN") or None
    token_file = env.get("REBOUND_TOKEN_FILE")
    if not token and token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip() or None
        except OSError as exc:
            raise EnvError(f"REBOUND_TOKEN_FILE={token_file!r}: {exc.strerror or exc}") from exc
    job = env.get("REBOUND_JOB") or env.get("SLURM_JOB_NAME") or ""
    if job and not JOB_KEY.match(job):
        job = job_key_from(job)
    if not job:
        job = job_key_from(argv0 if argv0 is not None else (sys.argv[0] if sys.argv else ""))
    try:
        heartbeat_s = float(env.get("REBOUND_HEARTBEAT_S") or DEFAULT_HEARTBEAT_S)
        retry_s = float(env.get("REBOUND_LAUNCH_RETRY_S") or DEFAULT_RETRY_S)
    except ValueError as exc:
        raise EnvError(f"REBOUND_HEARTBEAT_S or REBOUND_LAUNCH_RETRY_S: {exc}") from exc
    if not (heartbeat_s >= 0 and retry_s >= 0):
        raise EnvError("REBOUND_HEARTBEAT_S and REBOUND_LAUNCH_RETRY_S are seconds, not negative")
    rank = _int(env, "RANK", "SLURM_PROCID", default=0)
    world = _int(env, "WORLD_SIZE", "SLURM_NTASKS", default=1)
    if "RANK" in env:  # torchrun's set is whole: Slurm's do not mix into it
        local_rank = _int(env, "LOCAL_RANK", default=0)
        local_world = _int(env, "LOCAL_WORLD_SIZE")
    else:
        local_rank = _int(env, "LOCAL_RANK", "SLURM_LOCALID", default=0)
        local_world = _int(env, "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE")
    if world < 1 or not 0 <= rank < world:
        raise EnvError(f"RANK={rank} is not within WORLD_SIZE={world}")
    return LaunchEnv(
        url=env.get("REBOUND_URL") or None,
        token=token,
        job=job,
        node=env.get("REBOUND_NODE")
        or env.get("SLURMD_NODENAME")
        or socket.gethostname().split(".")[0]
        or "localhost",
        heartbeat_s=heartbeat_s,
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world or None,
        torchelastic_run_id=env.get("TORCHELASTIC_RUN_ID") or None,
        torchelastic_restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT"),
        slurm_job_id=env.get("SLURM_JOB_ID") or None,
        slurm_restart_count=_int(env, "SLURM_RESTART_COUNT"),
        slurm_nodelist=env.get("SLURM_JOB_NODELIST") or None,
        state_dir=env.get("REBOUND_LAUNCH_STATE") or None,
        retry_s=retry_s,
    )


def new_nonce() -> str:
    return secrets.token_hex(8)


def _id_part(value: str) -> str:
    """A launcher id fit for the identity: printable ASCII without '/' (others become
    '_'), a long one replaced by its digest."""
    clean = re.sub(r"[^ -.0-~]", "_", value)
    if len(clean) > _ID_PART_MAX:
        clean = "h" + hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()[:24]
    return clean


def launch_identity(env: LaunchEnv, nonce: str) -> str:
    """The launcher's ids present and the nonce; 1..200 printable ASCII characters."""
    parts = []
    if env.torchelastic_run_id is not None:
        restarts = env.torchelastic_restart_count or 0
        parts.append(f"te:{_id_part(env.torchelastic_run_id)}:r{restarts}")
    if env.slurm_job_id is not None:
        parts.append(f"slurm:{_id_part(env.slurm_job_id)}:r{env.slurm_restart_count or 0}")
    parts.append(f"n:{_id_part(nonce)}")
    return "/".join(parts)[-IDENTITY_MAX:]


def identity_digest(identity: str) -> str:
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


# --- the launch number ----------------------------------------------------------------


class LaunchRefused(Exception):
    """The console's gate refused this launch (409): `code` job_finished, cluster_paused
    or crash_loop (or what a newer console names), `detail` what to do."""

    def __init__(self, code: str, detail: str, body: dict | None = None):
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.body = body or {}


@dataclass(frozen=True)
class Reservation:
    job: str
    attempt: int
    launch: str
    created: bool


def _post(
    url: str, token: str, body: dict, timeout_s: float, path: str = LAUNCHES_PATH
) -> tuple[int, dict, str | None]:
    """POST `body` to `path` under the console's `url`: (status, JSON answer, Retry-After)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"REBOUND_URL must be http(s)://host[:port][/prefix], not {url!r}")
    conn_cls = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    conn = conn_cls(parts.netloc.rpartition("@")[2], timeout=timeout_s)
    try:
        conn.request(
            "POST",
            parts.path.rstrip("/") + path,
            body=json.dumps(body),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
                "User-Agent": "rebound-agent/1",
            },
        )
        response = conn.getresponse()
        raw = response.read(1 << 20)
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        return response.status, answer, response.getheader("Retry-After")
    finally:
        conn.close()


class ConsoleAway(Exception):
    """No launch number: the console did not answer in time, or answered what the agent
    cannot use (a 4xx other than 409). The job trains unreported."""


def reserve(
    url: str,
    token: str,
    job: str,
    identity: str,
    *,
    retry_s: float = DEFAULT_RETRY_S,
    timeout_s: float = 5.0,
    backoff_base_s: float = 0.5,
    backoff_cap_s: float = 8.0,
    sleep=time.sleep,
    clock=time.monotonic,
) -> Reservation:
    """The launch number of `identity`; `LaunchRefused` (409), or `ConsoleAway` when the
    console stayed away for `retry_s` or answered an error no retry mends (400, 401, 403)."""
    deadline = clock() + retry_s
    delay = backoff_base_s
    tries = 0
    while True:
        tries += 1
        retry_after = None
        try:
            status, answer, retry_after = _post(
                url, token, {"job": job, "launch": identity}, timeout_s
            )
        except (OSError, http.client.HTTPException) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        else:
            if status in (200, 201):
                try:
                    return Reservation(
                        job=str(answer["job"]),
                        attempt=int(answer["attempt"]),
                        launch=str(answer["launch"]),
                        created=bool(answer["created"]),
                    )
                except (KeyError, TypeError, ValueError) as exc:
                    what = f"the console's answer is not a launch: {answer!r}"[:500]
                    raise ConsoleAway(what) from exc
            detail = str(answer.get("detail") or f"HTTP {status}")
            if status == 409:
                raise LaunchRefused(str(answer.get("error") or "refused"), detail, answer)
            if status < 500 and status != 429:
                raise ConsoleAway(f"the console refused the request ({status}): {detail}")
            problem = f"HTTP {status}: {detail}"
        remaining = deadline - clock()
        if remaining <= 0:
            raise ConsoleAway(f"no answer from {url} after {tries} tries ({problem})")
        wait = delay * (0.5 + random.random() / 2)
        if retry_after:
            with contextlib.suppress(ValueError):
                wait = max(wait, min(float(retry_after), backoff_cap_s * 4))
        sleep(min(wait, remaining))
        delay = min(delay * 2, backoff_cap_s)


# --- the launch state file -------------------------------------------------------------


@dataclass
class LaunchState:
    """What a node's local rank 0 keeps in `<dir>/launch.json` for a launcher (see the
    module docstring); `save` replaces the file atomically and never raises (a state
    file never takes the job down)."""

    directory: str | None
    job: str
    attempt: int | None
    launch: str
    ready: bool = False
    ended: bool = False
    refused: dict | None = None
    reports: bool = True  # False on a node without rank 0: its wrapper ends nothing
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {
            "job": self.job,
            "attempt": self.attempt,
            "launch": self.launch,
            "ready": self.ready,
            "ended": self.ended,
            "reports": self.reports,
        }
        if self.refused is not None:
            out["refused"] = self.refused
        return {**out, **self.extra}

    def save(self, **changes) -> None:
        for name, value in changes.items():
            setattr(self, name, value)
        if not self.directory:
            return
        try:
            os.makedirs(self.directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".launch-", suffix=".json", dir=self.directory)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.as_dict(), f)
            os.replace(tmp, os.path.join(self.directory, STATE_FILE))
        except OSError as exc:
            print(
                f"rebound: cannot write the launch state in {self.directory}: {exc}",
                file=sys.stderr,
            )


def read_state(directory: str) -> dict | None:
    """`<directory>/launch.json`, or None when there is none (yet)."""
    try:
        with open(os.path.join(directory, STATE_FILE), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def process_started_at() -> float:
    """When this process started (unix seconds), from /proc; now where that is unknown.
    A launch's start is its processes' start: importing torch and building the model
    are startup, not training."""
    now = time.time()
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - age if 0 <= age < 86_400 else now
