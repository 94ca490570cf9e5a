"""The reporter: what a training process imports to send wire-format v1 events.

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
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import http.client
import itertools
import json
import logging
import math
import os
import random
import re
import secrets
import signal
import tempfile
import threading
import time
import weakref
from collections import deque
from datetime import datetime
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

__all__ = ["KINDS", "LIFECYCLE_KINDS", "Reporter"]

logger = logging.getLogger("rebound.agent")

KINDS = frozenset(
    {
        "attempt_started",
        "ready",
        "checkpoint_load_started",
        "checkpoint_loaded",
        "step",
        "checkpoint_save_started",
        "checkpoint_saved",
        "rank_window",
        "heartbeat",
        "fault",
        "attempt_ended",
        "job_finished",
    }
)
# What the reporter never sheds: all but heartbeats and rank windows.
LIFECYCLE_KINDS = KINDS - {"heartbeat", "rank_window"}
_KINDS_WITHOUT_ATTEMPT = frozenset({"heartbeat", "fault"})
# The console's job-key pattern (jobs/wire.py JOB_KEY), copied: the agent imports
# neither Django nor jobs. \A...\Z, as `$` would let a trailing newline through.
_SLUG = re.compile(r"\A[A-Za-z0-9_-]{1,100}\Z")

INGEST_PATH = "/api/v1/ingest"
MAX_EVENTS_PER_REQUEST = 5000
# The console's limit is 5 MiB, compressed or not; keep a little headroom.
MAX_BODY_BYTES = 5 * 1024 * 1024 - 4096
_BODY_OVERHEAD = len('{"events":[]}')
_MAX_RESPONSE_BYTES = 1 << 20
_RETRY_AFTER_MAX_S = 300.0
# How long spilling stays off after the spill file could not be written.
_SPILL_RETRY_S = 5.0

# Queue classes, in shedding order.
_HEARTBEAT, _WINDOW, _LIFECYCLE = 0, 1, 2
_CLASS_OF = {"heartbeat": _HEARTBEAT, "rank_window": _WINDOW}

_RUNNING, _CLOSED, _FORKED = "running", "closed", "forked"


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


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if not math.isfinite(seconds):
        return None
    return max(0.0, min(seconds, _RETRY_AFTER_MAX_S))


def _bad_indexes(body: bytes, n: int) -> set[int] | None:
    """The event indexes a 400 (`errors`) or a 409 (`conflicts`) names; None when it
    names none (the body as a whole)."""
    try:
        answer = json.loads(body)
        bad = {e["index"] for e in answer.get("errors") or answer.get("conflicts")}
    except (ValueError, AttributeError, TypeError, KeyError):
        return None
    if not bad or not all(type(i) is int and 0 <= i < n for i in bad):
        return None
    return bad


def _safe_name(value) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(value))[:64]


def default_spill_path(job: str, node: str | None, rank: int | None) -> str:
    """Stable across restarts of the same job, node and rank (so the next process finds it)."""
    where = f"{_safe_name(node) if node else 'node'}-{rank if rank is not None else 'x'}"
    return os.path.join(tempfile.gettempdir(), "rebound-agent", f"{job}-{where}.spill.jsonl")


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
        if not isinstance(job, str) or not _SLUG.match(job):
            raise ValueError(f"job must be a slug (letters, digits, '-', '_'), not {job!r}")
        if batch_size < 1 or max_queue < 1:
            raise ValueError("batch_size and max_queue must be at least 1")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http(s)://host[:port][/prefix], not {url!r}")
        path = parts.path.rstrip("/")
        if not path.endswith(INGEST_PATH):
            path += INGEST_PATH
        self.url = url
        self.job = job
        self.node = node
        self.rank = rank
        self.attempt = attempt
        self._https = parts.scheme == "https"
        self._netloc = parts.netloc.rpartition("@")[2]
        self._path = path
        self._headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "rebound-agent/1",
        }
        self._batch_size = min(batch_size, MAX_EVENTS_PER_REQUEST)
        self._interval = flush_interval_s
        self._max_queue = max_queue
        # Spilling frees a tenth of the queue at a time, so a full queue costs one
        # file write per many emits, not one per emit.
        self._spill_chunk = max(1, max_queue // 10)
        self._timeout = timeout_s
        self._backoff_base = backoff_base_s
        self._backoff_cap = backoff_cap_s
        self._gzip_min = gzip_min_bytes
        self.exit_timeout_s = exit_timeout_s

        self.spill_path = os.fspath(spill_path or default_spill_path(job, node, rank))
        self._sending_path = self.spill_path + ".sending"

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

        self._spill_file = None
        self._spill_broken_until = 0.0
        # The oldest own event (seq) in the spill file; 0 stands for a previous process's.
        self._spill_min = math.inf
        self._spill_nonempty = False
        self._sending_min = math.inf
        self._sending_exists = False
        self._sending_offset = 0

        self._sent = 0
        self._duplicates = 0
        self._shed = 0
        self._spilled = 0
        self._failures = 0
        self._rejected = 0
        self._last_error: str | None = None
        self._outage_logged = False
        self._refused_logged = False
        self._refused_streak = 0
        self._warned: set[str] = set()

        self._conn: http.client.HTTPConnection | None = None
        self._pick_up_spill()

        self._thread = threading.Thread(
            target=self._run, name=f"rebound-reporter-{job}", daemon=True
        )
        self._thread.start()
        _register(self, handle_sigterm)

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
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}; one of {', '.join(sorted(KINDS))}")
        if attempt is None:
            attempt = self.attempt
        if node is None:
            node = self.node
        if rank is None:
            rank = self.rank
        if attempt is None and kind not in _KINDS_WITHOUT_ATTEMPT:
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
        line = json.dumps(event, separators=(",", ":"), default=_json_default)
        if len(line) + 1 + _BODY_OVERHEAD > MAX_BODY_BYTES:
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
            self._close_spill_file(sync=True)
            self._settled.notify_all()
        self._drop_conn()
        _unregister(self)
        return delivered

    @property
    def stats(self) -> dict:
        """Counters: events sent (new to the console), duplicates, shed, spilled,
        rejected (invalid, dropped after a 400), failed requests, queued now, last error."""
        with self._lock:
            return {
                "sent": self._sent,
                "duplicates": self._duplicates,
                "shed": self._shed,
                "spilled": self._spilled,
                "rejected": self._rejected,
                "failures": self._failures,
                "queued": self._qlen() + len(self._inflight or ()),
                "spill_pending": self._spill_nonempty or self._sending_exists,
                "last_error": self._last_error,
            }

    # ---- the queue (all under self._lock) ----------------------------------------------------

    def _qlen(self) -> int:
        h, w, lc = self._queues
        return len(h) + len(w) + len(lc)

    def _pending_min(self) -> float:
        """The oldest event (by emit order) not yet settled; inf when none."""
        m = min(self._spill_min, self._sending_min)
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
        if time.monotonic() < self._spill_broken_until:
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
            self._close_spill_file(sync=False)

    def _take_batch(self, force: bool) -> list:
        """The oldest events, merged across the three queues, within the request limits."""
        if not force and self._qlen() < self._batch_size:
            return []
        queues = self._queues
        batch = []
        size = _BODY_OVERHEAD
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

    # ---- the spill file -----------------------------------------------------------------

    def _pick_up_spill(self) -> None:
        """A previous process's spill is sent first (seq 0: older than anything emitted)."""
        for path, attr in ((self._sending_path, "_sending"), (self.spill_path, "_spill")):
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if attr == "_sending":
                self._sending_exists = True
                self._sending_min = 0
            elif size > 0:
                self._spill_nonempty = True
                self._spill_min = 0
            if size:
                logger.info("rebound reporter: sending the %d bytes left in %s", size, path)

    def _open_spill(self):
        os.makedirs(os.path.dirname(os.path.abspath(self.spill_path)), exist_ok=True)
        f = open(self.spill_path, "ab", buffering=0)  # noqa: SIM115 - kept open between writes
        try:
            if f.tell() > 0:
                # A crash may have left a torn last line; end it so it stays one bad line.
                with open(self.spill_path, "rb") as r:
                    r.seek(-1, os.SEEK_END)
                    if r.read(1) != b"\n":
                        f.write(b"\n")
        except OSError:
            f.close()
            raise
        return f

    def _spill_write(self, entries) -> bool:
        """Append events to the spill file as JSON lines; False when it cannot be written."""
        if time.monotonic() < self._spill_broken_until:
            return False
        blob = "".join(e[2] + "\n" for e in entries).encode()
        try:
            if self._spill_file is None:
                self._spill_file = self._open_spill()
            view = memoryview(blob)
            while view:
                view = view[self._spill_file.write(view) :]
        except OSError as exc:
            self._spill_broken_until = time.monotonic() + _SPILL_RETRY_S
            self._last_error = f"spill: {exc}"
            self._close_spill_file(sync=False)
            logger.error("rebound reporter: cannot write the spill %s: %s", self.spill_path, exc)
            return False
        self._spilled += len(entries)
        self._spill_nonempty = True
        seqs = [e[0] for e in entries if e[0] is not None]
        if seqs:
            self._spill_min = min(self._spill_min, min(seqs))
        return True

    def _close_spill_file(self, sync: bool) -> None:
        f, self._spill_file = self._spill_file, None
        if f is None:
            return
        with contextlib.suppress(OSError):
            if sync:
                os.fsync(f.fileno())
            f.close()

    def _rotate_spill(self) -> bool:
        """Hand the spill file to the sender as `.sending`; new spills start a new file."""
        with self._lock:
            if self._sending_exists or not self._spill_nonempty:
                return self._sending_exists
            self._close_spill_file(sync=False)
            try:
                os.replace(self.spill_path, self._sending_path)
            except FileNotFoundError:
                self._spill_nonempty = False
                self._spill_min = math.inf
                self._settled.notify_all()
                return False
            self._sending_exists = True
            self._sending_offset = 0
            self._sending_min, self._spill_min = self._spill_min, math.inf
            self._spill_nonempty = False
            return True

    def _read_spill(self) -> tuple[list, int]:
        """Up to a batch of lines from `.sending` at the current offset, and the offset after."""
        lines = []
        size = _BODY_OVERHEAD
        with open(self._sending_path, "rb") as f:
            f.seek(self._sending_offset)
            while len(lines) < self._batch_size:
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
                        self._sending_path,
                        pos,
                    )
                    continue
                if lines and size + len(text) + 1 > MAX_BODY_BYTES:
                    f.seek(pos)
                    break
                lines.append(text.decode())
                size += len(text) + 1
            return lines, f.tell()

    def _send_spill_batch(self) -> bool:
        """Send the next batch of the spill; False when the thread is stopping."""
        if not self._rotate_spill():
            return True
        try:
            lines, end = self._read_spill()
        except FileNotFoundError:
            lines, end = [], 0
        except OSError as exc:
            with self._lock:
                self._last_error = f"spill: {exc}"
            logger.error("rebound reporter: cannot read the spill %s: %s", self._sending_path, exc)
            return not self._sleep(self._backoff(self._refused_streak))
        if not lines:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._sending_path)
            with self._lock:
                self._sending_exists = False
                self._sending_offset = 0
                self._sending_min = math.inf
                self._settled.notify_all()
            return True
        left, refused = self._deliver([(None, _LIFECYCLE, line) for line in lines])
        if not left:
            self._sending_offset = end
            return True
        if refused:
            return not self._sleep(self._refused_delay())
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
                        or self._sending_exists
                        or self._spill_nonempty
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
                self._close_spill_file(sync=True)
            self._settled.notify_all()

    def _drain(self, partial: bool) -> None:
        """Send the spill (oldest first), then full batches of the queue; with `partial`
        also the last, partial batch of what was queued at the start."""
        with self._lock:
            upto = self._seq if partial else 0
        while not self._stop:
            if self._sending_exists or self._spill_nonempty:
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
            if refused and self._sleep(self._refused_delay()):
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

    def _backoff(self, n: int) -> float:
        delay = min(self._backoff_cap, self._backoff_base * 2 ** min(n, 32))
        return delay * (0.5 + random.random() / 2)

    def _refused_delay(self) -> float:
        self._refused_streak += 1
        return self._backoff(self._refused_streak)

    def _deliver(self, entries: list) -> tuple[list, bool]:
        """Send `entries` until the console took them all.

        Returns what is left undelivered and whether the console refused us
        (401/403/...: left) rather than the thread stopping.
        """
        work = [entries]
        failures_in_row = 0
        while work:
            if self._abandoned:
                return [], False
            chunk = work[0]
            try:
                status, headers, body = self._post(chunk)
            except (OSError, http.client.HTTPException) as exc:
                self._failed(f"{type(exc).__name__}: {exc}")
                if self._sleep(self._backoff(failures_in_row)):
                    return [e for c in work for e in c], False
                failures_in_row += 1
                continue
            if 200 <= status < 300:
                self._delivered(chunk, body)
                work.pop(0)
                failures_in_row = 0
                continue
            # 400: invalid events; 409: events that would rewrite a launch's history (a
            # launch started twice, a new launch of a finished job). Neither is ever taken
            # on a resend, so those events are dropped (logged) and the rest delivered.
            if status in (400, 409):
                bad = _bad_indexes(body, len(chunk))
                if bad:
                    self._reject([chunk[i] for i in sorted(bad)], body, status)
                    rest = [e for i, e in enumerate(chunk) if i not in bad]
                    work[0:1] = [rest] if rest else []
                    continue
            if status in (400, 409, 413):
                # Find the culprit by halves; a single event refused so is dropped.
                if len(chunk) == 1:
                    self._reject(chunk, body, status)
                    work.pop(0)
                else:
                    mid = len(chunk) // 2
                    work[0:1] = [chunk[:mid], chunk[mid:]]
                continue
            if status in (408, 429) or status >= 500:
                self._failed(f"{status}: {body[:300].decode(errors='replace')}")
                wait = _retry_after(headers.get("Retry-After"))
                delay = self._backoff(failures_in_row)
                if wait is not None:
                    delay = max(wait, delay)  # never sooner than the console asked
                if self._sleep(delay, interruptible=wait is None):
                    return [e for c in work for e in c], False
                failures_in_row += 1
                continue
            self._refused(status, body)
            return [e for c in work for e in c], True
        return [], False

    def _delivered(self, chunk, body: bytes) -> None:
        try:
            answer = json.loads(body)
            accepted, duplicates = int(answer["accepted"]), int(answer["duplicates"])
        except (ValueError, TypeError, KeyError):
            accepted, duplicates = len(chunk), 0
        with self._lock:
            self._sent += accepted
            self._duplicates += duplicates
            if self._outage_logged or self._refused_logged:
                logger.warning("rebound reporter: the console takes events again")
            self._outage_logged = False
            self._refused_logged = False
            self._refused_streak = 0

    def _failed(self, error: str) -> None:
        with self._lock:
            self._failures += 1
            self._last_error = error
            first = not self._outage_logged
            self._outage_logged = True
        if first:
            logger.warning(
                "rebound reporter: cannot deliver to %s (%s); retrying with backoff, events kept",
                self.url,
                error,
            )
        else:
            logger.debug("rebound reporter: still failing: %s", error)

    def _refused(self, status: int, body: bytes) -> None:
        text = body[:2000].decode(errors="replace")
        with self._lock:
            self._failures += 1
            self._last_error = f"{status}: {text}"
            first = not self._refused_logged
            self._refused_logged = True
        if first:
            logger.error(
                "rebound reporter: the console at %s refused events with %d: %s -- "
                "events are kept in %s and retried with backoff; check the url, token and job",
                self.url,
                status,
                text,
                self.spill_path,
            )

    def _reject(self, entries, body: bytes, status: int = 400) -> None:
        ids = []
        for e in entries:
            try:
                ids.append(json.loads(e[2]).get("id"))
            except ValueError:
                ids.append(None)
        with self._lock:
            self._rejected += len(entries)
            self._last_error = f"{status}: {body[:300].decode(errors='replace')}"
        logger.error(
            "rebound reporter: the console refused %d event(s) %s with %d, dropped: %s",
            len(entries),
            ids[:20],
            status,
            body[:4000].decode(errors="replace"),
        )

    # ---- HTTP -----------------------------------------------------------------------------

    def _connect(self) -> http.client.HTTPConnection:
        if self._https:
            import ssl

            return http.client.HTTPSConnection(
                self._netloc, timeout=self._timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(self._netloc, timeout=self._timeout)

    def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _post(self, chunk) -> tuple[int, http.client.HTTPMessage, bytes]:
        body = ('{"events":[' + ",".join(e[2] for e in chunk) + "]}").encode()
        headers = self._headers
        if len(body) >= self._gzip_min:
            body = gzip.compress(body, compresslevel=6)
            headers = {**headers, "Content-Encoding": "gzip"}
        for _ in range(2):
            fresh = self._conn is None
            if fresh:
                self._conn = self._connect()
            conn = self._conn
            try:
                conn.request("POST", self._path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read(_MAX_RESPONSE_BYTES)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._drop_conn()
                if fresh:
                    raise
                continue  # a kept-alive connection the console had closed: once more, anew
            except BaseException:
                self._drop_conn()
                raise
            if response.will_close or not response.isclosed():
                self._drop_conn()
            return response.status, response.headers, data
        raise ConnectionError("unreachable")  # pragma: no cover - the loop returns or raises

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
        self._spill_file = None
        self._conn = None
        self._state = _FORKED


# ---- one atexit hook and one SIGTERM handler for all Reporters of the process ----------------

_registry: weakref.WeakSet[Reporter] = weakref.WeakSet()
# Re-entrant: the SIGTERM handler may run while the main thread holds it.
_registry_lock = threading.RLock()
_atexit_installed = False
_sigterm_installed = False


def _register(reporter: Reporter, handle_sigterm: bool) -> None:
    global _atexit_installed, _sigterm_installed
    with _registry_lock:
        _registry.add(reporter)
        if not _atexit_installed:
            atexit.register(_close_all)
            _atexit_installed = True
        if (
            handle_sigterm
            and not _sigterm_installed
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        ):
            # Only where nobody handles SIGTERM: a job's own handler decides for itself.
            signal.signal(signal.SIGTERM, _on_sigterm)
            _sigterm_installed = True


def _unregister(reporter: Reporter) -> None:
    with _registry_lock:
        _registry.discard(reporter)


def _close_all() -> None:
    with _registry_lock:
        reporters = list(_registry)
    if not reporters:
        return
    for r in reporters:
        r._request_flush()  # all send at once; then each waits what is left of the budget
    deadline = time.monotonic() + max(r.exit_timeout_s for r in reporters)
    for r in reporters:
        try:
            r.close(max(0.0, deadline - time.monotonic()))
        except Exception:  # pragma: no cover - never stand in the way of an exit
            logger.exception("rebound reporter: close at exit failed")


def _on_sigterm(signum, frame) -> None:
    _close_all()
    # What SIGTERM would have done without us: end the process.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _after_fork_in_child() -> None:
    global _registry, _registry_lock
    _registry_lock = threading.RLock()
    for r in list(_registry):
        r._after_fork_in_child()
    _registry = weakref.WeakSet()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
