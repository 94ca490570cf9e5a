"""Checkpoints of a DDP job with `torch.distributed.checkpoint`, reported as they go:
`Checkpointer` saves (async by default) and loads, `TrainState` is a model and its
optimizer as one entry. Imported from agent.torch_hooks in a training loop.

Checkpoints live in `<dir>/step-NNNNNNNN/`; rank 0 writes a marker file there
once the save is complete (for an async save, when its future resolves), and
only then reports `checkpoint_saved`. `latest_checkpoint(dir)` is the highest
step with a marker. Loading a named step older than the latest (a rollback)
retires the newer ones, so a later "resume from latest" does not jump back onto
the abandoned timeline.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from agent.checkpoints import (
    MARKER,
    RETIRED,
    checkpoint_path,
    checkpoint_steps,
    latest_checkpoint,
)

__all__ = ["Checkpointer", "TrainState"]


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


class TrainState(Stateful):
    """A model (DDP or not) and its optimizer as one `torch.distributed.checkpoint` entry,
    with the step it is the state of (`.step`)."""

    def __init__(self, model, optimizer, step: int = 0):
        self.model = model
        self.optimizer = optimizer
        self.step = step

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd, "step": self.step}

    def load_state_dict(self, state_dict):
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        self.step = int(state_dict.get("step", self.step))


class Checkpointer:
    """Saves and loads a job's state with torch.distributed.checkpoint and reports it.

    Every rank constructs it and calls `save` and `load` at the same steps (they
    are collective). Rank `report_rank` emits the events: `checkpoint_save_started`
    when a save begins; `checkpoint_saved` once it is complete on disk, with
    `blocking_s` = how long the training loop was held (for an async save: waiting
    for the previous one, plus staging a copy of the state; for a sync save: all
    of it); `checkpoint_load_started` and `checkpoint_loaded` around a restore.

    With `async_save` under torch.distributed, the background writes use a gloo
    process group of their own (created here: a collective call, so every rank
    constructs its Checkpointer at the same point) so their collectives never
    interleave with the training loop's, and work beside an NCCL default group."""

    def __init__(
        self,
        directory,
        emitter,
        *,
        rank: int | None = None,
        node: str | None = None,
        attempt: int | None = None,
        async_save: bool = True,
        tier: str = "durable",
        report_rank: int = 0,
        process_group=None,
    ):
        self.directory = Path(directory)
        self.emitter = emitter
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = int(rank if rank is not None else (dist.get_rank() if distributed else 0))
        self.node = node
        self.attempt = attempt
        self.async_save = async_save and hasattr(dcp, "async_save")
        self.tier = tier
        self.report_rank = report_rank
        self.distributed = distributed
        if process_group is None and distributed and self.async_save:
            process_group = dist.new_group(backend="gloo")
        self.process_group = process_group
        self._pending: threading.Event | None = None  # set when the save in flight ends
        self._lock = threading.Lock()
        self.saved: list[dict] = []  # what checkpoint_saved reported, in order
        if self.rank == report_rank:
            self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def reports(self) -> bool:
        return self.rank == self.report_rank

    def _emit(self, kind, data):
        if self.reports:
            self.emitter.emit(kind, data, attempt=self.attempt, node=self.node, rank=self.rank)

    def save(self, step: int, state: dict) -> float:
        """Saves `state` (a dict for dcp, e.g. {"train": TrainState(...)}) as step `step`.
        Returns the seconds the caller was blocked."""
        step = int(step)
        path = checkpoint_path(self.directory, step)
        self._emit("checkpoint_save_started", {"step": step})
        t0 = time.perf_counter()
        self.wait()  # one save in flight at a time
        if self.reports:
            path.mkdir(parents=True, exist_ok=True)
            # A rerun of this step (after a rollback) rewrites it: not complete meanwhile.
            for name in (MARKER, RETIRED):
                with contextlib.suppress(FileNotFoundError):
                    (path / name).unlink()
        kwargs = {"checkpoint_id": str(path), "process_group": self.process_group}
        if not self.distributed:
            kwargs["no_dist"] = True
        if self.async_save:
            fut = dcp.async_save(state, **kwargs)
            blocking = time.perf_counter() - t0
            finished = threading.Event()
            with self._lock:
                self._pending = finished
            fut.add_done_callback(lambda f: self._finished(step, path, blocking, f, finished))
        else:
            dcp.save(state, **kwargs)
            blocking = time.perf_counter() - t0
            self._complete(step, path, blocking)
        return blocking

    def _finished(self, step, path, blocking, fut, finished: threading.Event) -> None:
        try:
            exc = fut.exception()
            if exc is not None:
                # Logged, not reported as a fault: a save dies with its job when a peer is
                # lost, and that fault is the peer's.
                print(f"checkpoint of step {step} failed: {exc!r}", file=sys.stderr)
            else:
                self._complete(step, path, blocking)
        finally:
            finished.set()  # after the event: `wait()` returns once it is emitted

    def _complete(self, step, path, blocking) -> None:
        if not self.reports:
            return
        size = _dir_bytes(path)
        info = {
            "step": step,
            "bytes": size,
            "blocking_s": round(blocking, 6),
            "uri": path.resolve().as_uri(),
            "tier": self.tier,
        }
        # The marker is what makes the checkpoint count: written last, atomically.
        tmp = path / f".{MARKER}.tmp"
        tmp.write_text(json.dumps({**info, "saved_at": time.time()}))
        os.replace(tmp, path / MARKER)
        self.saved.append(info)
        self._emit("checkpoint_saved", info)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Waits for the async save in flight (if any) to finish; False on timeout."""
        with self._lock:
            pending = self._pending
        if pending is None:
            return True
        if not pending.wait(timeout_s):
            return False
        with self._lock:
            if self._pending is pending:
                self._pending = None
        return True

    def load(self, state: dict, step: int | None = None) -> int | None:
        """Restores `state` from step `step`, or from the latest complete checkpoint when
        None. Returns the step restored, or None when there is nothing to restore from.

        Rank 0 decides which step (the others follow), so all ranks load the same one.
        A named step older than the latest retires the newer checkpoints."""
        chosen = None
        if self.rank == 0 or not self.distributed:
            if step is None:
                chosen = latest_checkpoint(self.directory)
            elif int(step) in checkpoint_steps(self.directory):
                chosen = int(step)
            else:
                chosen = -int(step) - 1  # a missing named step: every rank raises
        if self.distributed:
            box = [chosen]
            dist.broadcast_object_list(box, src=0)
            chosen = box[0]
        if chosen is None:
            return None
        if chosen < 0:
            raise FileNotFoundError(
                f"no complete checkpoint of step {-chosen - 1} in {self.directory}"
            )
        self._emit("checkpoint_load_started", {"step": chosen})
        kwargs = {"checkpoint_id": str(checkpoint_path(self.directory, chosen))}
        if self.distributed:
            kwargs["process_group"] = self.process_group
        else:
            kwargs["no_dist"] = True
        dcp.load(state, **kwargs)
        if step is not None and self.reports:
            self.retire_after(chosen)
        self._emit("checkpoint_loaded", {"step": chosen})
        return chosen

    def retire_after(self, step: int) -> list[int]:
        """Takes the checkpoints newer than `step` out of `latest_checkpoint` (files kept)."""
        retired = []
        for s in checkpoint_steps(self.directory):
            if s > step:
                path = checkpoint_path(self.directory, s)
                with contextlib.suppress(FileNotFoundError):
                    os.replace(path / MARKER, path / RETIRED)
                    retired.append(s)
        return retired

    def close(self, timeout_s: float | None = None) -> None:
        """Waits for the last save to be durable."""
        self.wait(timeout_s)
