"""The reporter: what a training process imports to send wire-format v1 events.

Long module: the reporter's queue, shedding and sender thread are one
state machine over one lock; the spill file (agent.spill) and the HTTP transport
(agent.transport) live apart.

It owns one background thread per `Reporter` that batches events to
`POST /api/v1/ingest`, and a local spill file that keeps lifecycle events
through a console outage and across a process restart. Standard library only,
no Django: it runs inside training processes.

    from agent.reporter import Reporter

    r = Reporter(url="http://console:8000", token=TOKEN, job="llm-7b", node="n0", rank=0, attempt=1)
    r.emit("step", {"step": 12, "loss": 2.31})
    r.close()

`emit` never blocks on the network and never raises for network trouble: it
serialises the event and puts it on a bounded in-memory queue. When the queue
is full, heartbeats are shed first, then rank windows; the lifecycle kinds
(everything else) are never shed: the oldest of them go to the spill file,
which is sent (oldest first) once the console answers again, by this process
or by the next one started with the same `spill_path`.

Event ids are given at `emit` and kept through retries and spills, so a resend
is stored once (the console counts it as a duplicate).

This module owns the queue and the sender thread; the spill file is
`agent.spill`, posting and retrying `agent.transport`, the exit and SIGTERM
hooks `agent.process_hooks`. One class of ~500 lines on purpose: the queue, its
lock and conditions and the sender thread share one state.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import secrets
import threading
import time
from collections import deque
from datetime import datetime

from agent.process_hooks import register, unregister
from agent.spill import SpillFile, default_spill_path
from agent.transport import (
    BODY_OVERHEAD,
    MAX_BODY_BYTES,
    MAX_EVENTS_PER_REQUEST,
    Transport,
)
from common.vocabulary import JOB_KEY, KINDS_WITHOUT_ATTEMPT, WIRE_KINDS

__all__ = ["Reporter", "default_spill_path"]

logger = logging.getLogger("rebound.agent")

# Queue classes, in shedding order (common.vocabulary.SHEDDABLE_KINDS, then the rest:
# NEVER_SHED_KINDS).
_HEARTBEAT, _WINDOW, _LIFECYCLE = 0, 1, 2
_CLASS_OF = {"heartbeat": _HEARTBEAT, "rank_window": _WINDOW}

_RUNNING, _CLOSED, _FORKED = "running", "closed", "forked"
_KINDS = frozenset(WIRE_KINDS)


def _json_default(value):
    # numpy and torch scalars (and small arrays) without importing either.
    if hasattr(value, "item"):
        with contextlib.suppress(Exception):
            return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


# One encoder for every event: json.dumps with options builds a new one per call.
_encode = json.JSONEncoder(separators=(",", ":"), default=_json_default).encode


def _finite(data: dict) -> dict:
    """`data` with non-finite floats spelled as the wire format allows ("NaN", ...)."""
    for v in data.values():
        if type(v) is float and not math.isfinite(v):
            break
    else:
        return data
    out = {}
    for k, v in data.items():
        if type(v) is float and not math.isfinite(v):
            v = "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        out[k] = v
    return out


def _ts(value) -> float | str:
    if value is None:
        return time.time()
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        return value
    return float(value)


class Reporter:
    """Batches wire-format v1 events to the console from a background thread.

    `batch_size` events waiting, or `flush_interval_s` passing, sends a batch.
    Failed sends are retried with exponential backoff and jitter
    (`backoff_base_s` doubling up to `backoff_cap_s`), honouring Retry-After.
    """

    def __init__(
        self,
        url: str,
        token: str,
        job: str,
        *,
        node: str | None = None,
        rank: int | None = None,
        attempt: int | None = None,
        batch_size: int = 500,
        flush_interval_s: float = 1.0,
        max_queue: int = 50_000,
        spill_path: str | os.PathLike | None = None,
        timeout_s: float = 5.0,
        backoff_base_s: float = 0.5,
        backoff_cap_s: float = 30.0,
        gzip_min_bytes: int = 4096,
        exit_timeout_s: float = 10.0,
        handle_sigterm: bool = True,
    ):
        if not isinstance(job, str) or not JOB_KEY.match(job):
            raise ValueError(f"job must be a slug (letters, digits, '-', '_'), not {job!r}")
        if batch_size < 1 or max_queue < 1:
            raise ValueError("batch_size and max_queue must be at least 1")
        self.url = url
        self.job = job
        self.node = node
        self.rank = rank
        self.attempt = attempt
        self.spill_path = os.fspath(spill_path or default_spill_path(job, node, rank))
        self._transport = Transport(
            url,
            token,
            timeout_s=timeout_s,
            backoff_base_s=backoff_base_s,
            backoff_cap_s=backoff_cap_s,
            gzip_min_bytes=gzip_min_bytes,
            kept_in=self.spill_path,
        )
        self._batch_size = min(batch_size, MAX_EVENTS_PER_REQUEST)
        self._interval = flush_interval_s
        self._max_queue = max_queue
        # Spilling frees a tenth of the queue at a time, so a full queue costs one
        # file write per many emits, not one per emit.
        self._spill_chunk = max(1, max_queue // 10)
        self.exit_timeout_s = exit_timeout_s

        where = rank if rank is not None else (node or "x")
        # A random part per Reporter: a restarted process may get the same pid.
        prefix = f"{job}-{attempt or 0}-{where}-{os.getpid()}-{secrets.token_hex(3)}-"
        if len(prefix) > 100:
            prefix = f"{secrets.token_hex(8)}-{os.getpid()}-"
        self._id_prefix = prefix
        self._ids = itertools.count(1)

        # One lock; two conditions on it, so an emit wakes the sender, not a flush.
        self._lock = threading.RLock()  # re-entrant: the SIGTERM handler may interrupt an emit
        self._wake = threading.Condition(self._lock)
        self._settled = threading.Condition(self._lock)
        self._queues: tuple[deque, deque, deque] = (deque(), deque(), deque())
        self._seq = 0
        self._state = _RUNNING
        self._stop = False
        self._abandoned = False
        self._flush_wanted = False
        self._idle = False
        self._inflight_min: int | None = None
        self._inflight: list | None = None
        self._spill = SpillFile(self.spill_path)  # a previous process's spill is sent first
        self._shed = 0
        self._spilled = 0
        self._warned: set[str] = set()

        self._thread = threading.Thread(
            target=self._run, name=f"rebound-reporter-{job}", daemon=True
        )
        self._thread.start()
        register(self, handle_sigterm=handle_sigterm)

    def __repr__(self):
        return f"<Reporter job={self.job} node={self.node} rank={self.rank} {self._state}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(self.exit_timeout_s)

    # ---- the training side -------------------------------------------------------------

    def emit(
        self,
        kind: str,
        data: dict | None = None,
        *,
        ts=None,
        attempt: int | None = None,
        node: str | None = None,
        rank: int | None = None,
        event_id: str | None = None,
    ) -> str:
        """Queue one event and return its id. Raises only for a malformed event.

        `ts` is unix seconds (default now), a datetime or an RFC 3339 string;
        `attempt`, `node` and `rank` default to the Reporter's.
        """
        if kind not in _KINDS:
            raise ValueError(f"unknown event kind {kind!r}; one of {', '.join(sorted(_KINDS))}")
        if attempt is None:
            attempt = self.attempt
        if node is None:
            node = self.node
        if rank is None:
            rank = self.rank
        if attempt is None and kind not in KINDS_WITHOUT_ATTEMPT:
            raise ValueError(f"{kind} needs an attempt (give it to the Reporter or to emit)")
        if kind == "heartbeat" and node is None:
            raise ValueError("heartbeat needs a node (give it to the Reporter or to emit)")
        if kind == "rank_window" and rank is None:
            raise ValueError("rank_window needs a rank (give it to the Reporter or to emit)")
        if event_id is None:
            event_id = self._id_prefix + str(next(self._ids))
        event = {"id": event_id, "job": self.job, "kind": kind, "ts": _ts(ts)}
        if attempt is not None:
            event["attempt"] = attempt
        if node is not None:
            event["node"] = node
        if rank is not None:
            event["rank"] = rank
        if data:
            if not isinstance(data, dict):
                raise TypeError(f"data must be a dict, not {type(data).__name__}")
            event["data"] = _finite(data)
        line = _encode(event)
        if len(line) + 1 + BODY_OVERHEAD > MAX_BODY_BYTES:
            raise ValueError(f"a {kind} event of {len(line)} bytes is over the request limit")
        cls = _CLASS_OF.get(kind, _LIFECYCLE)

        with self._lock:
            self._seq += 1
            entry = (self._seq, cls, line)
            if self._state != _RUNNING:
                self._emit_not_running(entry)
                return event_id
            queues = self._queues
            if self._qlen() >= self._max_queue and not self._make_room(cls):
                self._shed += 1
                return event_id
            queues[cls].append(entry)
            if self._idle and self._qlen() >= self._batch_size:
                self._wake.notify()
        return event_id

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything emitted so far is delivered (or shed, or rejected as invalid).

        False when `timeout_s` passed first; what is left stays queued or spilled.
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            target = self._seq
            if self._state == _RUNNING:
                self._flush_wanted = True
                self._wake.notify()
            while self._pending_min() <= target:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._state != _RUNNING or not self._thread.is_alive():
                    return False
                self._settled.wait(remaining)
            return True

    def close(self, timeout_s: float = 10.0) -> bool:
        """Flush (at most `timeout_s`), stop the thread, spill what is left. Idempotent.

        Returns whether everything was delivered. Lifecycle events and rank
        windows still undelivered go to the spill file for the next process.
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            if self._state != _RUNNING:
                return self._pending_min() > self._seq
        # Keep a moment after the flush to stop the thread and spill the rest.
        grace = min(0.5, timeout_s / 5)
        delivered = self.flush(max(0.0, timeout_s - grace))
        with self._lock:
            if self._state != _RUNNING:  # closed meanwhile by another thread
                return self._pending_min() > self._seq
            self._stop = True
            self._wake.notify_all()
        self._thread.join(max(0.05, deadline - time.monotonic()))
        with self._lock:
            if self._state != _RUNNING:
                return self._pending_min() > self._seq
            if self._thread.is_alive():
                # Stuck in a request: take over its batch; a resend is only a duplicate.
                self._abandoned = True
                if self._inflight:
                    self._restore(self._inflight)
                    self._inflight = None
                    self._inflight_min = None
            self._spill_leftovers()
            self._state = _CLOSED
            self._spill.close(sync=True)
            self._settled.notify_all()
        self._transport.close()
        unregister(self)
        return delivered

    @property
    def stats(self) -> dict:
        """Counters: events sent (new to the console), duplicates, shed, spilled,
        rejected (invalid, dropped after a 400), failed requests, queued now, last error."""
        with self._lock:
            sent = self._transport.counters()
            return {
                "sent": sent["sent"],
                "duplicates": sent["duplicates"],
                "shed": self._shed,
                "spilled": self._spilled,
                "rejected": sent["rejected"],
                "failures": sent["failures"],
                "queued": self._qlen() + len(self._inflight or ()),
                "spill_pending": self._spill.pending,
                "last_error": sent["last_error"],
            }

    # ---- the queue (all under self._lock) ----------------------------------------------------

    def _qlen(self) -> int:
        h, w, lc = self._queues
        return len(h) + len(w) + len(lc)

    def _pending_min(self) -> float:
        """The oldest event (by emit order) not yet settled; inf when none."""
        m = self._spill.pending_min
        for q in self._queues:
            if q and q[0][0] < m:
                m = q[0][0]
        if self._inflight_min is not None and self._inflight_min < m:
            m = self._inflight_min
        return m

    def _make_room(self, cls: int) -> bool:
        """Free a place for an event of `cls`; False when that event is the one to shed."""
        heartbeats, windows, lifecycle = self._queues
        if heartbeats:
            heartbeats.popleft()
            self._shed += 1
            return True
        if cls == _HEARTBEAT:
            return False
        if windows:
            windows.popleft()
            self._shed += 1
            return True
        if cls == _WINDOW:
            return False
        if self._spill.broken:
            # Nothing of the lifecycle kinds is dropped: the queue grows past its bound.
            self._warn_once("over", "the queue is over max_queue: the spill file cannot be written")
            return True
        chunk = [lifecycle.popleft() for _ in range(min(self._spill_chunk, len(lifecycle)))]
        if not self._spill_write(chunk):
            lifecycle.extendleft(reversed(chunk))
        return True

    def _emit_not_running(self, entry) -> None:
        if self._state == _FORKED:
            self._shed += 1
            self._warn_once("forked", "a Reporter is not usable in a forked child; event dropped")
        elif entry[1] == _HEARTBEAT:
            self._shed += 1
        else:
            self._warn_once("closed", f"emit after close: kept in the spill {self.spill_path}")
            if not self._spill_write([entry]):
                self._shed += 1
            self._spill.close(sync=False)

    def _take_batch(self, force: bool) -> list:
        """The oldest events, merged across the three queues, within the request limits."""
        if not force and self._qlen() < self._batch_size:
            return []
        queues = self._queues
        batch = []
        size = BODY_OVERHEAD
        while len(batch) < self._batch_size:
            best = None
            for q in queues:
                if q and (best is None or q[0][0] < best[0][0]):
                    best = q
            if best is None:
                break
            add = len(best[0][2]) + 1
            if batch and size + add > MAX_BODY_BYTES:
                break
            batch.append(best.popleft())
            size += add
        return batch

    def _restore(self, entries) -> None:
        """Put unsent events back at the front of their queues."""
        for entry in reversed(entries):
            if entry[0] is not None:  # events read from the spill are still in it
                self._queues[entry[1]].appendleft(entry)

    def _spill_leftovers(self) -> None:
        """At close: heartbeats are shed, everything else goes to the spill."""
        heartbeats, windows, lifecycle = self._queues
        self._shed += len(heartbeats)
        heartbeats.clear()
        rest = sorted([*windows, *lifecycle])
        if rest and self._spill_write(rest):
            windows.clear()
            lifecycle.clear()
        elif rest:
            self._shed += len(rest)
            logger.error(
                "rebound reporter: %d events could not be spilled to %s and are lost",
                len(rest),
                self.spill_path,
            )
            windows.clear()
            lifecycle.clear()

    # ---- the spill file (under self._lock, but for reading `.sending`) -------------------

    def _spill_write(self, entries) -> bool:
        """Append events to the spill file; False when it cannot be written."""
        if self._spill.write(entries):
            self._spilled += len(entries)
            return True
        if self._spill.error:
            self._transport.note_error(f"spill: {self._spill.error}")
            self._spill.error = None
        return False

    def _send_spill_batch(self) -> bool:
        """Send the next batch of the spill; False when the thread is stopping."""
        with self._lock:
            if not self._spill.rotate():
                self._settled.notify_all()  # the file was gone: nothing left to wait for
                return True
        try:
            lines, end = self._spill.read(self._batch_size)
        except FileNotFoundError:
            lines, end = [], 0
        except OSError as exc:
            self._transport.note_error(f"spill: {exc}")
            logger.error(
                "rebound reporter: cannot read the spill %s: %s", self._spill.sending_path, exc
            )
            return not self._sleep(self._transport.streak_delay())
        if not lines:
            with self._lock:
                self._spill.sent_all()
                self._settled.notify_all()
            return True
        left, refused = self._deliver([(None, _LIFECYCLE, line) for line in lines])
        if not left:
            self._spill.advance(end)
            return True
        if refused:
            return not self._sleep(self._transport.refused_delay())
        return False

    # ---- the sender thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            tick = time.monotonic() + self._interval
            while True:
                with self._lock:
                    self._idle = True
                    while not (
                        self._stop
                        or self._flush_wanted
                        or self._qlen() >= self._batch_size
                        or self._spill.pending
                    ):
                        remaining = tick - time.monotonic()
                        if remaining <= 0:
                            break
                        self._wake.wait(remaining)
                    self._idle = False
                    if self._stop:
                        break
                    # A full batch alone goes at once; a partial one waits for the tick or a flush.
                    partial = self._flush_wanted or time.monotonic() >= tick
                    self._flush_wanted = False
                self._drain(partial)
                if partial:
                    tick = time.monotonic() + self._interval
        except Exception:
            logger.exception("rebound reporter: the sender thread failed; events stay queued")
            with self._lock:
                self._settled.notify_all()
            return
        with self._lock:
            if not self._abandoned:
                self._spill_leftovers()
                self._spill.close(sync=True)
            self._settled.notify_all()

    def _drain(self, partial: bool) -> None:
        """Send the spill (oldest first), then full batches of the queue; with `partial`
        also the last, partial batch of what was queued at the start."""
        with self._lock:
            upto = self._seq if partial else 0
        while not self._stop:
            if self._spill.pending:
                if not self._send_spill_batch():
                    return
                continue
            with self._lock:
                heads = [q[0][0] for q in self._queues if q]
                batch = self._take_batch(force=bool(heads) and min(heads) <= upto)
                if not batch:
                    return
                self._inflight = batch
                self._inflight_min = batch[0][0]
            left, refused = self._deliver(batch)
            with self._lock:
                if self._inflight is batch:
                    self._inflight = None
                    self._inflight_min = None
                    if refused:
                        # Kept on disk while the console refuses us, not in memory.
                        self._restore(left)
                        self._spill_leftovers()
                    elif left:
                        self._restore(left)
                self._settled.notify_all()
            if refused and self._sleep(self._transport.refused_delay()):
                return

    def _sleep(self, delay: float, interruptible: bool = True) -> bool:
        """Wait out a backoff; a flush cuts it short once. True when stopping."""
        deadline = time.monotonic() + delay
        with self._lock:
            while not self._stop:
                if interruptible and self._flush_wanted:
                    self._flush_wanted = False
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._wake.wait(remaining)
            return self._stop

    def _deliver(self, entries: list) -> tuple[list, bool]:
        """What of `entries` is left undelivered, and whether the console refused us."""
        return self._transport.deliver(
            entries, sleep=self._sleep, abandoned=lambda: self._abandoned
        )

    # ---- process hooks --------------------------------------------------------------------

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("rebound reporter: %s", message)

    def _request_flush(self) -> None:
        with self._lock:
            self._flush_wanted = True
            self._wake.notify()

    def _after_fork_in_child(self) -> None:
        # The sender thread does not exist here, and the lock may be held by it.
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._settled = threading.Condition(self._lock)
        self._queues = (deque(), deque(), deque())
        self._inflight = None
        self._inflight_min = None
        self._spill.after_fork_in_child()
        self._transport.after_fork_in_child()
        self._state = _FORKED
