"""The zero-config agent: one call instruments a torch job from its environment.

    import agent

    dist.init_process_group("nccl")          # torchrun / srun set the env:// variables
    model = DDP(MyModel().cuda())
    inst = agent.init(model)                 # or Instrument.from_env(model)
    for step in range(first, last + 1):
        with inst.step(step) as s:
            ...
            s.report(loss=loss)
    inst.finish()                            # the job is done: launch ended, job finished

`init` reads the environment (`agent.launch_env`: REBOUND_URL, REBOUND_TOKEN or
REBOUND_TOKEN_FILE, REBOUND_JOB, the launcher's RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
TORCHELASTIC_*, SLURM_*), and then, once per launch:

1. rank 0 draws a nonce, makes the launch identity and asks the console for the launch
   number (`POST /api/v1/launches`), retrying while the console is away;
2. every rank shares its host name and rank 0 the answer, in one `all_gather_object`
   (a world of 1 needs none): every rank reports with the same launch number, and
   rank 0 knows the launch's nodes;
3. rank 0 sends `attempt_started` (world size, GPUs per node = LOCAL_WORLD_SIZE, the
   nodes, the launcher's ids), stamped at its process's start, so the time to import,
   build and rendezvous counts as startup;
4. every process gets a Reporter; the one process per node with LOCAL_RANK 0 sends
   the node's heartbeats every REBOUND_HEARTBEAT_S (default 10 s);
5. the model, when it is a DistributedDataParallel, gets the comm hook (`attach`).

Before all that, SIGUSR1 becomes a checkpoint request (agent.checkpoint_request): the
loop asks `agent.checkpoint_requested()` each step and saves when it says so.

From then on the Instrument reports the lifecycle by itself: `ready` as the first step
begins, `attempt_ended` (completed) at `inst.close()`, and with `inst.finish()` also
`job_finished` (the training loop says the job is done; nothing more will come). Used
as a context manager (`with agent.init(model) as inst:`), an exception out of the block
reports a `fault` (crash) and ends the launch `failed`. Lifecycle events have ids
stable per launch (`launch-<n>-<digest of the identity>-<kind>`), so a resend is
stored once. Per step the agent does no more than before: a flag is checked.

When the console refuses the launch (409: job finished, cluster paused, crash loop)
rank 0 prints its `detail` on stderr and every rank exits with
`agent.launch_env.EXIT_REFUSED`. When there is no console (REBOUND_URL unset) or it
stays away, the job trains unreported and rank 0 says so once on stderr: training
never fails because the console is away.
"""

from __future__ import annotations

import sys

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from agent.checkpoint_request import install_signal_handler
from agent.launch_env import (
    EXIT_REFUSED,
    ConsoleAway,
    EnvError,
    LaunchEnv,
    LaunchRefused,
    LaunchState,
    identity_digest,
    launch_identity,
    new_nonce,
    process_started_at,
    read_env,
    reserve,
)
from agent.reporter import Reporter
from agent.sinks import NullSink
from agent.torch_hooks import Instrument

__all__ = ["EXIT_REFUSED", "Launch", "init"]


class Launch:
    """This launch as every rank knows it: the job, its number and identity, the world."""

    def __init__(self, *, env: LaunchEnv, attempt, identity, nodes, rank, world_size):
        self.env = env
        self.job = env.job
        self.attempt = attempt
        self.identity = identity
        self.nodes = nodes
        self.rank = rank
        self.world_size = world_size
        self.gpus_per_node = env.local_world_size or -(-world_size // max(1, len(nodes)))
        self._digest = identity_digest(identity) if identity else ""
        # One launch.json per node, for the node's wrapper; only rank 0's reports.
        self.state = LaunchState(
            env.state_dir if env.local_rank == 0 else None,
            job=env.job,
            attempt=attempt,
            launch=identity,
            reports=rank == 0,
        )

    def event_id(self, kind: str) -> str:
        """The id of this launch's once-only event `kind`: a resend is a duplicate."""
        return f"launch-{self.attempt}-{self._digest}-{kind}"

    def __repr__(self):
        return f"<Launch {self.job}#{self.attempt} {self.identity} world {self.world_size}>"


def _say(message: str) -> None:
    print(f"rebound: {message}", file=sys.stderr, flush=True)


def _ask(env: LaunchEnv) -> tuple:
    """Rank 0's question to the console: ("ok", attempt, identity), ("off", why, identity)
    or ("refused", code, detail, identity)."""
    identity = launch_identity(env, new_nonce())
    if not env.url:
        return ("off", "REBOUND_URL is not set", identity)
    if not env.token:
        return ("off", "neither REBOUND_TOKEN nor REBOUND_TOKEN_FILE is set", identity)
    try:
        got = reserve(env.url, env.token, env.job, identity, retry_s=env.retry_s)
    except LaunchRefused as exc:
        return ("refused", exc.code, exc.detail, identity)
    except (ConsoleAway, ValueError) as exc:
        return ("off", str(exc), identity)
    except Exception as exc:  # never the job's end, and the other ranks wait for this answer
        return ("off", f"asking for the launch number failed: {exc!r}", identity)
    return ("ok", got.attempt, identity)


def init(
    model=None,
    *,
    environ=None,
    window: int = 10,
    process_group=None,
    reporter_options: dict | None = None,
) -> Instrument:
    """The Instrument of this process, its launch numbered and started; see the module
    docstring. Call it after `torch.distributed.init_process_group` (when the world is
    larger than 1), on every rank. `environ` replaces os.environ (tests);
    `reporter_options` go to the Reporter."""
    # SIGUSR1 (Slurm's checkpoint_job) becomes agent.checkpoint_requested(), first:
    # by default it would end the process.
    install_signal_handler()
    try:
        env = read_env(environ)
    except EnvError as exc:
        _say(f"{exc}; this job reports nothing")
        return Instrument(NullSink(), window=window)
    started_at = process_started_at()
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(process_group), dist.get_world_size(process_group)
    else:
        rank, world = env.rank, env.world_size
        if world > 1:
            raise RuntimeError(
                "agent.init() needs torch.distributed initialised first when WORLD_SIZE > 1:"
                " call dist.init_process_group() before it"
            )
    answer = _ask(env) if rank == 0 else None
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, (env.node, answer), group=process_group)
        hosts = [g[0] for g in gathered]
        answer = gathered[0][1]
    else:
        hosts = [env.node]
    nodes = list(dict.fromkeys(hosts))

    if answer[0] == "refused":
        _, code, detail, identity = answer
        if rank == 0:
            _say(f"the console refused launch {identity!r} of job {env.job} ({code}): {detail}")
        if env.local_rank == 0:  # every node's wrapper stops its launcher
            LaunchState(env.state_dir, job=env.job, attempt=None, launch=identity).save(
                refused={"code": code, "detail": detail}, ended=True, reports=rank == 0
            )
        raise SystemExit(EXIT_REFUSED)
    if answer[0] == "off":
        if rank == 0:
            _say(f"reporting is off for job {env.job}: {answer[1]}; training goes on unreported")
        inst = Instrument(NullSink(), rank=rank, node=env.node, window=window)
        if isinstance(model, DistributedDataParallel):
            inst.attach(model, process_group)
        return inst

    _, attempt, identity = answer
    launch = Launch(
        env=env, attempt=attempt, identity=identity, nodes=nodes, rank=rank, world_size=world
    )
    reporter = Reporter(
        env.url,
        env.token,
        env.job,
        node=env.node,
        rank=rank,
        attempt=attempt,
        **(reporter_options or {}),
    )
    inst = Instrument(
        reporter,
        rank=rank,
        node=env.node,
        attempt=attempt,
        window=window,
        heartbeat_s=env.heartbeat_s if env.local_rank == 0 and env.heartbeat_s > 0 else None,
    )
    inst.reporter = reporter
    inst.adopt(launch, owns_emitter=True)
    if rank == 0:
        data = {"launch": identity, **env.launcher()}
        inst.attempt_started(
            world_size=world,
            gpus_per_node=launch.gpus_per_node,
            nodes=nodes,
            ts=started_at,
            extra=data,
        )
    launch.state.save()  # on each node's local rank 0 (the others keep no file)
    if isinstance(model, DistributedDataParallel):
        inst.attach(model, process_group)
    return inst
