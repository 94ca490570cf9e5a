"""The `noop` driver: does nothing to any cluster and records every call.

Used for dry runs (an action in dry-run mode calls this instead of its cluster's
driver, and the recorded call is the action's output: what would have been
done) and by the unit tests of the state machine, which read `NoopDriver.calls`
and may queue errors in `NoopDriver.errors` to be raised by the next calls.

A real (not dry-run) call's output carries `called_at`, the wall-clock time
(time.time()) the driver was called, so that what happened in a worker's memory can still
be timed from the stored action (bench/recovery.py measures to it).
"""

from __future__ import annotations

import threading
import time

_lock = threading.Lock()


class NoopDriver:
    name = "noop"
    # Shared by every instance in the process, so a test sees what a task did.
    calls: list[dict] = []
    errors: list[Exception] = []

    def __init__(self, *, dry_run: bool = False, **options):
        self.dry_run = dry_run
        self.options = options

    @classmethod
    def reset(cls) -> None:
        with _lock:
            cls.calls.clear()
            cls.errors.clear()

    def _call(self, op: str, **args) -> dict:
        called_at = time.time()
        with _lock:
            self.calls.append({"op": op, **args})
            error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error
        if self.dry_run:
            return {"dry_run": True, "would": {"op": op, **args}}
        return {"noop": True, "op": op, **args, "called_at": called_at}

    def cordon(self, node, *, key):
        return self._call("cordon", node=node, key=key)

    def uncordon(self, node, *, key):
        return self._call("uncordon", node=node, key=key)

    def drain(self, node, *, key):
        return self._call("drain", node=node, key=key)

    def restart_job(self, job, from_step, nodes, *, key):
        return self._call("restart_job", job=job, from_step=from_step, nodes=nodes, key=key)

    def replace_node(self, job, node, spare, *, key):
        return self._call("replace_node", job=job, node=node, spare=spare, key=key)

    def scale_down(self, job, nodes, *, key):
        return self._call("scale_down", job=job, nodes=list(nodes), key=key)

    def validate_node(self, node, *, key):
        return self._call("validate_node", node=node, key=key)

    def checkpoint_job(self, job, *, key):
        return self._call("checkpoint_job", job=job, key=key)

    def node_status(self, node):
        return {"node": node, "driver": "noop"}

    def job_status(self, job):
        return {"job": job, "driver": "noop"}
