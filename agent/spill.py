"""The reporter's spill file: where events wait on disk through a console outage
and across a process restart. Standard library only.

Two files per reporter. New spills are appended, one JSON event a line, to the
spill path; the sender hands the file over to itself by renaming it to
`<path>.sending`, sends that file's lines in batches (remembering its offset),
and removes it once all are delivered, while new spills start a new file. A
process that finds either file at start sends it first: the next process
started with the same path picks up what the last one left.

`SpillFile` is not thread-safe by itself: the reporter calls it under its lock,
except `read`, which only the sender thread calls (it alone moves the offset).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import tempfile
import time

from agent.transport import BODY_OVERHEAD, MAX_BODY_BYTES

logger = logging.getLogger("rebound.agent")

# How long spilling stays off after the spill file could not be written.
RETRY_S = 5.0


def _safe_name(value) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(value))[:64]


def default_spill_path(job: str, node: str | None, rank: int | None) -> str:
    """Stable across restarts of the same job, node and rank (so the next process finds it)."""
    where = f"{_safe_name(node) if node else 'node'}-{rank if rank is not None else 'x'}"
    return os.path.join(tempfile.gettempdir(), "rebound-agent", f"{job}-{where}.spill.jsonl")


class SpillFile:
    """The spill file and its `.sending` hand-over, and what is known of their contents.

    Each event written carries the reporter's emit order (`seq`); `pending_min` is the
    oldest not yet delivered from either file (0 for a previous process's events,
    older than anything emitted now; inf when both are empty)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.sending_path = self.path + ".sending"
        self.error: str | None = None  # the last write failure, until the reporter takes it
        self._file = None
        self._broken_until = 0.0
        self._spill_min = math.inf  # the oldest own event in the spill file
        self._spill_nonempty = False
        self._sending_min = math.inf  # ... and in `.sending`
        self._sending_exists = False
        self._sending_offset = 0
        self._pick_up()

    @property
    def pending(self) -> bool:
        """Whether either file holds events still to send."""
        return self._spill_nonempty or self._sending_exists

    @property
    def pending_min(self) -> float:
        return min(self._spill_min, self._sending_min)

    @property
    def broken(self) -> bool:
        """Whether writing stays off for now, after a failed write."""
        return time.monotonic() < self._broken_until

    def _pick_up(self) -> None:
        """A previous process's spill is sent first (seq 0: older than anything emitted)."""
        for path, sending in ((self.sending_path, True), (self.path, False)):
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if sending:
                self._sending_exists = True
                self._sending_min = 0
            elif size > 0:
                self._spill_nonempty = True
                self._spill_min = 0
            if size:
                logger.info("rebound reporter: sending the %d bytes left in %s", size, path)

    # ---- writing ------------------------------------------------------------------------

    def _open(self):
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        f = open(self.path, "ab", buffering=0)  # noqa: SIM115 - kept open between writes
        try:
            if f.tell() > 0:
                # A crash may have left a torn last line; end it so it stays one bad line.
                with open(self.path, "rb") as r:
                    r.seek(-1, os.SEEK_END)
                    if r.read(1) != b"\n":
                        f.write(b"\n")
        except OSError:
            f.close()
            raise
        return f

    def write(self, entries) -> bool:
        """Append queue entries `(seq, class, line)` as JSON lines; False when the file
        cannot be written (then `error` says why, and writing stays off for RETRY_S)."""
        if self.broken:
            return False
        blob = "".join(e[2] + "\n" for e in entries).encode()
        try:
            if self._file is None:
                self._file = self._open()
            view = memoryview(blob)
            while view:
                view = view[self._file.write(view) :]
        except OSError as exc:
            self._broken_until = time.monotonic() + RETRY_S
            self.error = str(exc)
            self.close(sync=False)
            logger.error("rebound reporter: cannot write the spill %s: %s", self.path, exc)
            return False
        self._spill_nonempty = True
        seqs = [e[0] for e in entries if e[0] is not None]
        if seqs:
            self._spill_min = min(self._spill_min, min(seqs))
        return True

    def close(self, sync: bool) -> None:
        """Close the file between writes (`sync`: make what was written durable first)."""
        f, self._file = self._file, None
        if f is None:
            return
        with contextlib.suppress(OSError):
            if sync:
                os.fsync(f.fileno())
            f.close()

    def after_fork_in_child(self) -> None:
        self._file = None  # the parent's to close

    # ---- sending ------------------------------------------------------------------------

    def rotate(self) -> bool:
        """Hand the spill file to the sender as `.sending` unless one is being sent;
        new spills start a new file. Whether there is a `.sending` to read now."""
        if self._sending_exists or not self._spill_nonempty:
            return self._sending_exists
        self.close(sync=False)
        try:
            os.replace(self.path, self.sending_path)
        except FileNotFoundError:
            self._spill_nonempty = False
            self._spill_min = math.inf
            return False
        self._sending_exists = True
        self._sending_offset = 0
        self._sending_min, self._spill_min = self._spill_min, math.inf
        self._spill_nonempty = False
        return True

    def read(self, batch_size: int) -> tuple[list, int]:
        """Up to a batch of lines from `.sending` at the current offset, and the offset
        after them; torn lines are skipped."""
        lines = []
        size = BODY_OVERHEAD
        with open(self.sending_path, "rb") as f:
            f.seek(self._sending_offset)
            while len(lines) < batch_size:
                pos = f.tell()
                raw = f.readline()
                if not raw:
                    break
                text = raw.strip()
                if not text:
                    continue
                try:
                    ok = isinstance(json.loads(text), dict)
                except ValueError:
                    ok = False
                if not ok:
                    logger.warning(
                        "rebound reporter: skipping a torn line in %s at byte %d",
                        self.sending_path,
                        pos,
                    )
                    continue
                if lines and size + len(text) + 1 > MAX_BODY_BYTES:
                    f.seek(pos)
                    break
                lines.append(text.decode())
                size += len(text) + 1
            return lines, f.tell()

    def advance(self, offset: int) -> None:
        """The lines of `.sending` before `offset` are delivered."""
        self._sending_offset = offset

    def sent_all(self) -> None:
        """Everything in `.sending` is delivered: remove it."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.sending_path)
        self._sending_exists = False
        self._sending_offset = 0
        self._sending_min = math.inf
