"""Torch hooks: what a DDP training loop reports, in a few lines.

Long module: the training-side measurements read together (the comm hook, the step
timer, the heartbeat, the Instrument that ties them to a launch), the one module a
torch job imports for them.

Owns the training-side measurements of wire format v1: `step` events (rank 0),
`rank_window` means (every rank), heartbeats and lifecycle events; checkpoints
saved and loaded with `torch.distributed.checkpoint` come from
agent.torch_checkpoint, re-exported here. Events go to
any object with the reporter's `emit` method (`agent.reporter.Reporter`,
`agent.sinks.FileSink`).

`agent.init(ddp_model)` (or `Instrument.from_env`) makes the Instrument from the
environment, with its launch number, lifecycle and heartbeats (agent.auto). By hand:

    from agent.torch_hooks import Checkpointer, Instrument, TrainState

    inst = Instrument(reporter, rank=rank, node=node, attempt=attempt, heartbeat_s=5)
    inst.attach(ddp_model)            # DDP comm hook: times the wait on gradient all-reduce
    state = {"train": TrainState(ddp_model, optimizer)}
    ckpt = Checkpointer("/shared/ckpt/my-job", reporter, rank=rank, attempt=attempt)
    start = (ckpt.load(state) or 0) + 1   # latest complete checkpoint; step=N rolls back
    for step in range(start, last_step + 1):
        with inst.step(step) as s:
            with s.data_wait():
                x, y = next(batches)
            loss = loss_fn(ddp_model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            s.report(loss=loss, tokens=x.numel())
        if step % 100 == 0:
            ckpt.save(step, state)        # async: blocks only while staging a copy
    ckpt.close()                          # waits for the last save to be durable
    inst.close()

How compute and communication are told apart. DDP overlaps the gradient
all-reduce with the backward pass: each bucket's all-reduce starts as soon as
its gradients exist, and `backward()` returns only once every bucket's future
has completed. So the time a rank was *blocked* on communication is the tail
from the launch of the last bucket (its backward compute is over then) to the
completion of the last all-reduce future; communication hidden under compute
costs nothing and is not counted. `attach` registers a comm hook that does what
DDP's default `allreduce_hook` does (same numerics) and records both instants, the
completion from a `then` callback on the future. A fast rank waiting for a slow
peer shows the wait there; the slow rank itself reaches the all-reduce last
and waits little. Per step:

    step_s      = the wall time of the `inst.step()` block (ended after reading the
                  reported loss, which on a GPU waits for the step's kernels)
    comm_wait_s = the all-reduce tails of the step's backward passes (+ `s.comm_wait()` blocks)
    data_wait_s = the `s.data_wait()` blocks
    compute_s   = step_s - comm_wait_s - data_wait_s

Timing sections around `backward()` instead would put the whole overlapped
all-reduce into "backward" and could not tell a slow rank from the ranks that
wait for it. Collectives outside DDP (a loss all-reduce for logging, say) go
in `with s.comm_wait():`.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import time

import torch
import torch.distributed as dist

from agent.checkpoints import checkpoint_path, checkpoint_steps, latest_checkpoint
from agent.sinks import wire_number
from agent.torch_checkpoint import Checkpointer, TrainState

__all__ = [
    "Checkpointer",
    "CommTimer",
    "Heartbeat",
    "Instrument",
    "StepTimer",
    "TrainState",
    "checkpoint_path",
    "checkpoint_steps",
    "latest_checkpoint",
    "timed_allreduce_hook",
]

# --- communication timing --------------------------------------------------------------


class CommTimer:
    """The DDP comm hook's state: how long backward passes stayed blocked on all-reduce.

    The hook marks each bucket's launch and the completion callbacks each completion
    (appends to a deque, atomic under the GIL: no lock on the hot path); `wait_s`
    settles the marks in order when read, on the training thread. It only grows; a
    step reads how much it grew while the step ran. With `measure_cost` the hook also
    counts its own CPU time in `own_s` (the benchmarks' figure; off, it reads no clock
    for that)."""

    def __init__(self, process_group=None, clock=time.perf_counter, measure_cost=False):
        self.process_group = process_group
        self.measure_cost = measure_cost
        self.clock = clock
        self.marks: collections.deque = collections.deque()  # (t, is_last), a done (t, None)
        self._pending = 0
        self._last_launch = 0.0
        self._last_done = 0.0
        self._last_launched = False
        self._wait_s = 0.0
        self.allreduces = 0
        # CPU seconds of the hook's Python (with measure_cost), apart per thread: the
        # hook runs on the training thread, the completions on the collective's.
        self.hook_s = 0.0
        self.done_s = 0.0

    @property
    def own_s(self) -> float:
        return self.hook_s + self.done_s

    def launched(self, is_last: bool) -> None:
        self.marks.append((self.clock(), is_last))

    def done(self) -> None:
        self.marks.append((self.clock(), None))

    @property
    def wait_s(self) -> float:
        marks = self.marks
        while marks:
            t, is_last = marks.popleft()
            if is_last is not None:  # a launch
                self._pending += 1
                self._last_launch = t
                self._last_launched = self._last_launched or is_last
                continue
            self._pending -= 1
            self.allreduces += 1
            self._last_done = max(self._last_done, t)
            if self._last_launched and self._pending == 0:
                # The backward pass is over: its exposed tail is the wait.
                self._wait_s += max(0.0, self._last_done - self._last_launch)
                self._last_launched = False
                self._last_done = 0.0
        return self._wait_s


def timed_allreduce_hook(state, bucket):
    """DDP's default all-reduce (`default_hooks.allreduce_hook`: divide by the world
    size, all-reduce), with the launch and completion times marked, in one callback.

    With `state.measure_cost`, its own CPU time is counted (`state.own_s`), leaving out the
    division and the collective's launch: DDP's built-in hook does both without the
    agent. (No annotations: DDP checks them against dist.GradBucket, and this module's
    postponed annotations would be strings.)"""
    if state.measure_cost:
        return _costed_allreduce_hook(state, bucket)
    marks, clock = state.marks, state.clock
    marks.append((clock(), bucket.is_last()))
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    work = dist.all_reduce(bucket.buffer().div_(group.size()), group=group, async_op=True)

    def _done(f):
        marks.append((clock(), None))
        return f.value()[0]

    return work.get_future().then(_done)


def _costed_allreduce_hook(state, bucket):
    t0 = time.thread_time()
    state.launched(bucket.is_last())
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    t1 = time.thread_time()
    work = dist.all_reduce(bucket.buffer().div_(group.size()), group=group, async_op=True)
    t2 = time.thread_time()

    def _done(f):
        t = time.thread_time()
        state.done()
        value = f.value()[0]
        state.done_s += time.thread_time() - t
        return value

    fut = work.get_future().then(_done)
    state.hook_s += (t1 - t0) + (time.thread_time() - t2)
    return fut


# --- steps and windows -------------------------------------------------------------------


def _number(v):
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        v = v.item()  # any dtype; no autograd involved
    return wire_number(float(v))


class _Wait:
    """A `with` block whose wall time is added to a StepTimer's field (a plain class:
    a generator-based context manager costs several times more per block)."""

    __slots__ = ("_field", "_t", "_timer")

    def __init__(self, timer: StepTimer, field: str):
        self._timer, self._field = timer, field

    def __enter__(self) -> None:
        self._t = self._timer._clock()

    def __exit__(self, exc_type, exc, tb) -> bool:
        timer = self._timer
        setattr(timer, self._field, getattr(timer, self._field) + timer._clock() - self._t)
        return False


class StepTimer:
    """One step's timing; made by `Instrument.step(n)`, used as a context manager."""

    def __init__(self, instrument: Instrument, step: int):
        self.instrument = instrument
        self.step = int(step)
        self.loss = None
        self.grad_norm = None
        self.tokens = None
        self.data_wait_s = 0.0
        self.comm_wait_s = 0.0  # explicit `comm_wait()` blocks
        self._clock = instrument.clock
        self._t0 = 0.0
        self._comm0 = 0.0

    def __enter__(self):
        comm = self.instrument.comm
        self._comm0 = comm.wait_s if comm is not None else 0.0
        self._t0 = self._clock()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            inst = self.instrument
            t = time.thread_time() if inst.measure_cost else 0.0
            # Reading a loss tensor waits for the step's kernels (on GPU): before the clock.
            self.loss, self.grad_norm = _number(self.loss), _number(self.grad_norm)
            inst._finish(self, self._clock() - self._t0)
            if inst.measure_cost:
                inst.own_s += time.thread_time() - t
        return False

    def data_wait(self) -> _Wait:
        """Time spent waiting for input (loading, collating, host-to-device)."""
        return _Wait(self, "data_wait_s")

    def comm_wait(self) -> _Wait:
        """Time blocked on a collective outside DDP's gradient all-reduce."""
        return _Wait(self, "comm_wait_s")

    def report(self, *, loss=None, grad_norm=None, tokens=None) -> None:
        """What the `step` event carries (tensors are read with `.item()`)."""
        if loss is not None:
            self.loss = loss
        if grad_norm is not None:
            self.grad_norm = grad_norm
        if tokens is not None:
            self.tokens = int(tokens)


class Heartbeat:
    """Emits `heartbeat` (node, and rank when given) every `interval_s` from a daemon thread.

    `muted` is asked before each beat: a node told to fall silent stays silent."""

    def __init__(
        self, emitter, *, node, rank=None, attempt=None, interval_s=5.0, muted=None, name=None
    ):
        if not node:
            raise ValueError("a heartbeat names its node")
        self.emitter = emitter
        self.node = node
        self.rank = rank
        self.attempt = attempt
        self.interval_s = float(interval_s)
        self.muted = muted
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=name or f"heartbeat-{node}", daemon=True
        )

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def beat(self) -> None:
        if self.muted is not None and self.muted():
            return
        self.emitter.emit("heartbeat", {}, attempt=self.attempt, node=self.node, rank=self.rank)
        self.beats += 1

    def _run(self):
        while not self._stop.is_set():
            try:
                self.beat()
            except Exception as exc:  # a heartbeat never takes the job down
                print(f"heartbeat: {exc!r}", file=sys.stderr)
            self._stop.wait(self.interval_s)

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)


class Instrument:
    """The per-process reporting of a DDP job: steps, rank windows, lifecycle, heartbeats.

    Only `report_rank` (0) emits `step` and the once-per-launch events; every rank
    emits its `rank_window` when a step number is a multiple of `window`, and its
    last partial window on `close()`."""

    def __init__(
        self,
        emitter,
        *,
        rank: int | None = None,
        node: str | None = None,
        attempt: int | None = None,
        window: int = 10,
        report_rank: int = 0,
        heartbeat_s: float | None = None,
        heartbeat_muted=None,
        clock=time.perf_counter,
        measure_cost: bool = False,
    ):
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.emitter = emitter
        self.rank = int(rank)
        self.node = node
        self.attempt = attempt
        self.window = max(1, int(window))
        self.report_rank = report_rank
        self.clock = clock
        # Count the agent's own CPU time (`cost()`): the benchmarks' figure, a few clock
        # reads per step that a job need not pay.
        self.measure_cost = measure_cost
        self.comm: CommTimer | None = None
        self.last: dict | None = None  # the last step's timing
        self._rows: list[tuple[int, float, float, float, float]] = []
        self._explicit_comm = False
        self.heartbeat = None
        self.own_s = 0.0  # CPU seconds its step bookkeeping took on the training thread
        self.reporter = emitter
        # Set by `adopt` (agent.auto): the launch whose lifecycle this Instrument reports.
        self.launch = None
        self._owns_emitter = False
        self._ready_due = False
        self._closed = False
        if heartbeat_s and node:
            self.heartbeat = Heartbeat(
                emitter,
                node=node,
                rank=self.rank,
                attempt=attempt,
                interval_s=heartbeat_s,
                muted=heartbeat_muted,
            ).start()

    @classmethod
    def from_env(cls, model=None, **kwargs) -> Instrument:
        """The zero-config Instrument: `agent.auto.init(model, **kwargs)`."""
        from agent.auto import init

        return init(model, **kwargs)

    def adopt(self, launch, *, owns_emitter: bool = False) -> None:
        """Report `launch`'s lifecycle by itself (agent.auto): `ready` as the first step
        begins, `attempt_ended` at `close`, `job_finished` at `finish`, each with an id
        stable per launch; with `owns_emitter`, `close` closes the emitter too."""
        self.launch = launch
        self._owns_emitter = owns_emitter
        self._ready_due = True

    @property
    def reports(self) -> bool:
        return self.rank == self.report_rank

    def _lifecycle_id(self, kind: str, event_id: str | None) -> str | None:
        if event_id is None and self.launch is not None:
            return self.launch.event_id(kind)
        return event_id

    def emit(self, kind, data=None, **kwargs):
        kwargs.setdefault("attempt", self.attempt)
        kwargs.setdefault("node", self.node)
        kwargs.setdefault("rank", self.rank)
        return self.emitter.emit(kind, data or {}, **kwargs)

    def attach(self, ddp_model, process_group=None) -> CommTimer:
        """Registers the timed all-reduce comm hook on a DistributedDataParallel model."""
        self.comm = CommTimer(process_group, clock=self.clock, measure_cost=self.measure_cost)
        ddp_model.register_comm_hook(self.comm, timed_allreduce_hook)
        return self.comm

    def step(self, step: int) -> StepTimer:
        if self._ready_due:  # the first step of an adopted launch: it is ready
            self.ready()
        return StepTimer(self, step)

    def _finish(self, s: StepTimer, step_s: float) -> None:
        comm = s.comm_wait_s
        if self.comm is not None:
            comm += self.comm.wait_s - s._comm0
        self._explicit_comm = self._explicit_comm or s.comm_wait_s > 0
        comm = min(comm, step_s)
        data = min(s.data_wait_s, step_s - comm)
        compute = max(0.0, step_s - comm - data)
        self.last = {
            "step": s.step,
            "step_s": step_s,
            "compute_s": compute,
            "comm_wait_s": comm,
            "data_wait_s": data,
        }
        if self.reports:
            data_ = {"step": s.step, "step_time_s": round(step_s, 6)}
            for name, value in (("loss", s.loss), ("grad_norm", s.grad_norm)):
                if value is not None:
                    data_[name] = value
            if s.tokens is not None:
                data_["tokens"] = s.tokens
            self.emit("step", data_)
        self._rows.append((s.step, step_s, compute, comm, data))
        if s.step % self.window == 0:
            self.flush_window()

    def flush_window(self) -> None:
        """Emits the mean of the steps since the last window (if any)."""
        rows, self._rows = self._rows, []
        if not rows:
            return
        n = len(rows)
        data = {
            "first_step": min(r[0] for r in rows),
            "last_step": max(r[0] for r in rows),
            "step_s": round(sum(r[1] for r in rows) / n, 6),
            "compute_s": round(sum(r[2] for r in rows) / n, 6),
            "data_wait_s": round(sum(r[4] for r in rows) / n, 6),
        }
        if self.comm is not None or self._explicit_comm:
            data["comm_wait_s"] = round(sum(r[3] for r in rows) / n, 6)
        self.emit("rank_window", data)

    # Once-per-launch events: emitted by the reporting rank only.

    def attempt_started(
        self, *, world_size, gpus_per_node=None, nodes=None, ts=None, extra=None, event_id=None
    ):
        if self.reports:
            data = {**(extra or {}), "world_size": int(world_size)}
            if gpus_per_node:
                data["gpus_per_node"] = int(gpus_per_node)
            if nodes:
                data["nodes"] = list(nodes)
            event_id = self._lifecycle_id("attempt_started", event_id)
            self.emit("attempt_started", data, ts=ts, event_id=event_id)

    def ready(self, event_id=None):
        self._ready_due = False
        if self.reports:
            self.emit("ready", event_id=self._lifecycle_id("ready", event_id))
            if self.launch is not None:
                self.launch.state.save(ready=True)

    def attempt_ended(self, reason="completed", exit_code=None, event_id=None):
        if self.reports:
            data = {"reason": reason}
            if exit_code is not None:
                data["exit_code"] = int(exit_code)
            self.emit("attempt_ended", data, event_id=self._lifecycle_id("attempt_ended", event_id))

    @contextlib.contextmanager
    def pause(self, reason: str = "evaluation"):
        """The loop stops stepping on purpose (an evaluation, a long data reload):
        rank 0 announces it (`pause_started` .. `pause_ended`), so that the hang
        detector does not take the time for a stall, nor learn it as a step interval."""
        if self.reports:
            self.emit("pause_started", {"reason": str(reason)[:64]})
        try:
            yield
        finally:
            if self.reports:
                self.emit("pause_ended")

    def fault(self, type_, message=None, **data):
        """A fault seen by this rank (any rank may report one)."""
        data = {"type": type_, **data}
        if message:
            data["message"] = str(message)[:4096]
        self.emit("fault", data)

    def close(self, *, finished: bool = False, reason: str = "completed", exit_code=None) -> None:
        """Flushes the last rank window and stops the heartbeat. For an adopted launch
        (agent.auto) rank 0 also ends it (`attempt_ended` with `reason`) and, with
        `finished`, finishes the job (`job_finished`); then the Reporter is closed (its
        events flushed). Idempotent: a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        self.flush_window()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.launch is None:
            return
        self.attempt_ended(reason, exit_code=exit_code)
        if finished and self.reports:
            self.emit("job_finished", event_id=self.launch.event_id("job_finished"))
        self.launch.state.save(ended=True)  # a no-op but on a node's local rank 0
        if self._owns_emitter:
            self.emitter.close()

    def finish(self) -> None:
        """The training loop is done and so is the job: the launch ends completed and the
        job finished (rank 0 sends both); `close(finished=True)`."""
        self.close(finished=True)

    def __enter__(self) -> Instrument:
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None or (issubclass(exc_type, SystemExit) and not exc.code):
            self.close()
        else:
            self.fault("crash", f"{exc_type.__name__}: {exc}")
            self.close(reason="failed", exit_code=1)
        return False

    def cost(self) -> dict:
        """What the agent itself has cost this process so far, in CPU seconds (so other
        work on the cores neither hides nor inflates it), counted with `measure_cost`
        (zeros without): its work on the training thread (step bookkeeping and events,
        the comm hook's Python and its completions, the clock reads that count them)
        and its threads (the reporter's sender, the heartbeat)."""
        hook_s = self.comm.own_s if self.comm is not None else 0.0
        return {"main_s": self.own_s + hook_s, "threads_cpu_s": agent_threads_cpu_s()}


AGENT_THREADS = ("rebound-reporter", "heartbeat-")


def agent_threads_cpu_s() -> float:
    """CPU seconds used so far by the agent's live threads in this process."""
    total = 0.0
    for t in threading.enumerate():
        if t.name.startswith(AGENT_THREADS) and t.ident is not None:
            with contextlib.suppress(OSError, OverflowError):
                total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    return total
