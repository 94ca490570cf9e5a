"""Honouring "checkpoint now" (recovery's checkpoint_job) in a training loop.

A request reaches a job one of two ways, depending on the cluster's driver:

- local: a new request id in the job's control file (agent.control, `checkpoint`),
  the file named by `--control` or $REBOUND_CONTROL;
- slurm: SIGUSR1 to the job's steps (`scancel --signal=USR1`). The handler that turns
  it into a request is installed by `agent.init` (or `install_signal_handler()`); a
  process without one dies of SIGUSR1, its default action.

The loop asks once per step, beside its own cadence:

    if step % every == 0 or agent.checkpoint_requested(agree=True):
        save(step)

`checkpoint_requested()` is True once per request (a signal, or a new id in the file).
Each rank receives a request on its own, a step apart at worst; with `agree=True` rank
0's answer is broadcast (one tiny collective per call), so that every rank saves at
the same step, as a collective save needs. The agent does not save anything itself.

Stdlib only at import: torch is imported only for `agree=True` in a distributed job.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from agent.control import JobControl

ENV_CONTROL = "REBOUND_CONTROL"
CHECKPOINT_SIGNAL = signal.SIGUSR1

_signalled = threading.Event()
_installed: set[int] = set()
_controls: dict[str, JobControl] = {}


def install_signal_handler(sig: int = CHECKPOINT_SIGNAL) -> bool:
    """Makes `sig` (SIGUSR1) a checkpoint request instead of the end of the process; a
    handler set before is still called. Only the main thread may set one: elsewhere
    this returns False and changes nothing."""
    if sig in _installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.getsignal(sig)

    def on_signal(signum, frame):
        _signalled.set()  # only a flag: the loop acts at its next step
        if callable(previous):
            previous(signum, frame)

    signal.signal(sig, on_signal)
    _installed.add(sig)
    return True


def _control(control) -> JobControl | None:
    if isinstance(control, JobControl):
        return control
    path = control or os.environ.get(ENV_CONTROL)
    if not path:
        return None
    path = str(path)
    if path not in _controls:
        _controls[path] = JobControl(path)
    return _controls[path]


def _local_request(control) -> bool:
    asked = _signalled.is_set()
    if asked:
        _signalled.clear()
    c = _control(control)
    if c is not None and c.checkpoint_requested() is not None:
        asked = True
    return asked


def checkpoint_requested(control=None, *, agree: bool = False) -> bool:
    """True once per checkpoint request: SIGUSR1 received, or a new request id in the
    job's control file (`control`: a JobControl or its path; default $REBOUND_CONTROL).
    `agree`: in a distributed job, every rank gets rank 0's answer (call it on every
    rank, at the same point of the step)."""
    asked = _local_request(control)
    if not agree:
        return asked
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return asked
    if dist.get_world_size() == 1:
        return asked
    import torch

    flag = torch.tensor([1 if asked else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.broadcast(flag, src=0)
    return bool(flag.item())
