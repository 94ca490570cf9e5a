"""Fault-injection switches: small JSON files written by the cluster, read by the job.

A job's control file (one per job) is read by every rank at each step:

    {"slow": {"1": 4.0},                      # rank -> factor: its compute takes 4x as long
     "loss": {"mode": "nan" | "spike",         # corrupt the loss ...
              "from_step": 120, "until_step": null,   # ... on these steps (inclusive)
              "factor": 10.0, "rank": null},   # spike factor; one rank or all (null)
     "checkpoint": {"id": "rebound:action-7",  # save a checkpoint now: a new id asks
                    "at": 1764780000.0}}       # once (recovery's checkpoint_job)

A node's flags file is read by its node agent and by the ranks it runs:

    {"heartbeats": false}                      # the node falls silent

Readers re-read a file only when it changed (one `stat` per call), so a
training loop may ask every step. Writers replace the file atomically and
serialise their read-modify-write with a lock file. No torch here.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from pathlib import Path

from common.vocabulary import JOB_KEY

# Job keys and node names double as file names here: both are held to the
# console's job-key alphabet (letters, digits, '-', '_': no '/', '.' or newline).
SLUG = JOB_KEY


class JsonFile:
    """A JSON object on disk, re-read only when the file changes; `{}` while missing."""

    def __init__(self, path):
        self.path = Path(path)
        self._key = None
        self._value: dict = {}

    def get(self) -> dict:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._key, self._value = None, {}
            return self._value
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._key:
            try:
                self._value = json.loads(self.path.read_text() or "{}")
            except (OSError, ValueError):
                return self._value  # being replaced: keep the last good value
            self._key = key
        return self._value


def write_json(path, value: dict) -> None:
    """Replaces `path` with `value` atomically (readers see the old or the new file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
    os.replace(tmp, path)


def read_json(path, default=None):
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return default


@contextlib.contextmanager
def update_json(path):
    """Read-modify-write of a JSON object file under an exclusive lock:

    with update_json(p) as value: value["x"] = 1
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        value = read_json(path, {}) or {}
        yield value
        write_json(path, value)


# --- the job's control file ---------------------------------------------------------


class JobControl:
    """What the fault switches ask of one rank, read from the job's control file."""

    def __init__(self, path=None):
        self._file = JsonFile(path) if path else None
        # A request already in the file when the job starts was made of an earlier
        # launch (which saved, or was replaced by this one): not asked again.
        self._seen_checkpoint = self._checkpoint_id()

    def _get(self) -> dict:
        return self._file.get() if self._file else {}

    def _checkpoint_id(self) -> str | None:
        spec = self._get().get("checkpoint")
        rid = spec.get("id") if isinstance(spec, dict) else None
        return str(rid) if rid else None

    def checkpoint_requested(self) -> str | None:
        """The id of a checkpoint request made since the last call (or since this
        process started), once; None when there is none new. One `stat` per call."""
        rid = self._checkpoint_id()
        if rid is None or rid == self._seen_checkpoint:
            return None
        self._seen_checkpoint = rid
        return rid

    def slow_factor(self, rank: int) -> float:
        """How many times longer this rank's compute should take (1.0: normal)."""
        try:
            f = float(self._get().get("slow", {}).get(str(rank), 1.0))
        except (TypeError, ValueError):
            return 1.0
        return f if math.isfinite(f) and f > 1.0 else 1.0

    def loss_fault(self, step: int, rank: int) -> tuple[str, float] | None:
        """("nan", _) or ("spike", factor) when this step's loss is to be corrupted."""
        spec = self._get().get("loss")
        if not spec:
            return None
        if spec.get("rank") is not None and int(spec["rank"]) != rank:
            return None
        if step < int(spec.get("from_step", 0)):
            return None
        if spec.get("until_step") is not None and step > int(spec["until_step"]):
            return None
        mode = spec.get("mode")
        if mode == "nan":
            return ("nan", math.nan)
        if mode == "spike":
            return ("spike", float(spec.get("factor", 10.0)))
        return None


def set_slow(path, rank: int, factor: float) -> None:
    """Makes `rank` compute `factor` times as long; a factor of 1 (or less) clears it."""
    with update_json(path) as value:
        slow = value.setdefault("slow", {})
        if factor > 1.0:
            slow[str(rank)] = float(factor)
        else:
            slow.pop(str(rank), None)


def set_loss_fault(
    path,
    mode: str,
    *,
    from_step: int,
    until_step: int | None = None,
    factor: float = 10.0,
    rank: int | None = None,
) -> None:
    """Corrupts the loss from `from_step` (to `until_step`, inclusive): NaN, or x `factor`."""
    if mode not in ("nan", "spike"):
        raise ValueError("mode is 'nan' or 'spike'")
    with update_json(path) as value:
        value["loss"] = {
            "mode": mode,
            "from_step": int(from_step),
            "until_step": until_step,
            "factor": float(factor),
            "rank": rank,
        }


def request_checkpoint(path, request_id: str) -> bool:
    """Asks the job to save a checkpoint now; `request_id` names the request, so a
    repeat with the same id asks nothing new. True when this call made the request."""
    with update_json(path) as value:
        spec = value.get("checkpoint")
        if isinstance(spec, dict) and spec.get("id") == request_id:
            return False
        value["checkpoint"] = {"id": str(request_id), "at": time.time()}
        return True


def clear_faults(path) -> None:
    """Takes every fault switch of a job off (a checkpoint request is no fault: kept)."""
    with update_json(path) as value:
        kept = value.get("checkpoint")
        value.clear()
        if kept is not None:
            value["checkpoint"] = kept


# --- a node's flags ----------------------------------------------------------------


class NodeFlags:
    """A node's switches as its agent and its ranks read them."""

    def __init__(self, path=None):
        self._file = JsonFile(path) if path else None

    def heartbeats(self) -> bool:
        return bool(self._file.get().get("heartbeats", True)) if self._file else True


def set_node_heartbeats(path, on: bool) -> None:
    with update_json(path) as value:
        value["heartbeats"] = bool(on)
