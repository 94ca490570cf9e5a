"""Where the training side's events go, besides the reporter: a JSON-lines file.

Everything that emits events (torch hooks, the demo job, the local cluster)
takes any object with the reporter's `emit` method:

    emit(kind, data=None, *, ts=None, attempt=None, node=None, rank=None, event_id=None) -> id

`FileSink` writes one wire-format v1 event per line instead of posting it, so
tests can read what was emitted and a run can be replayed into the console
later (`replay(path, reporter)`). Several processes may append to one file:
each event is a single `write` on a file opened with O_APPEND, which Linux
keeps whole. `make_sink` builds a sink from a small spec a launcher can pass
on to the processes it starts. No torch and no Django here.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

# Strict JSON has no NaN or infinity; the wire format takes these spellings.
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def wire_number(v):
    """`v` as the wire format writes it: a non-finite float as its string spelling."""
    if type(v) is float and not math.isfinite(v):
        return "NaN" if math.isnan(v) else _NON_FINITE[v]
    return v


def wire_data(data: dict | None) -> dict:
    return {k: wire_number(v) for k, v in (data or {}).items()}


def new_event_id() -> str:
    return uuid.uuid4().hex


class FileSink:
    """Writes each event as one JSON line to `path` (appending; parents are created).

    `job`, `node`, `rank` and `attempt` are defaults for every event, as the
    reporter's are; an event without a job has no `job` field (a replay into a
    reporter takes the reporter's)."""

    def __init__(self, path, job=None, *, node=None, rank=None, attempt=None):
        self.path = Path(path)
        self.job = job
        self.node = node
        self.rank = rank
        self.attempt = attempt
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        self._written = 0

    def emit(self, kind, data=None, *, ts=None, attempt=None, node=None, rank=None, event_id=None):
        event = {"id": event_id or new_event_id()}
        if self.job is not None:
            event["job"] = self.job
        event["kind"] = kind
        event["ts"] = time.time() if ts is None else ts
        for name, value in (
            ("attempt", attempt if attempt is not None else self.attempt),
            ("node", node if node is not None else self.node),
            ("rank", rank if rank is not None else self.rank),
        ):
            if value is not None:
                event[name] = value
        event["data"] = wire_data(data)
        line = (json.dumps(event, allow_nan=False, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._fd is None:
                raise ValueError(f"FileSink({self.path}) is closed")
            os.write(self._fd, line)
            self._written += 1
        return event["id"]

    def flush(self, timeout_s: float = 10.0) -> bool:
        return True  # every emit is written at once

    def close(self, timeout_s: float = 10.0) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    @property
    def stats(self) -> dict:
        return {"emitted": self._written, "sent": self._written, "dropped": 0, "queued": 0}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<FileSink {self.path} job={self.job}>"


class NullSink:
    """Takes events and drops them (a process told to report nowhere)."""

    def emit(self, kind, data=None, *, ts=None, attempt=None, node=None, rank=None, event_id=None):
        return event_id or new_event_id()

    def flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        pass

    stats = {"emitted": 0, "sent": 0, "dropped": 0, "queued": 0}


def iter_events(path) -> Iterator[dict]:
    """The events of a JSON-lines file, in file order. A last line still being
    written (no newline yet) is left out."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return
    for line in raw.split(b"\n")[:-1]:
        if line.strip():
            yield json.loads(line)


def read_events(path, *, kind=None, job=None) -> list[dict]:
    """The events of a JSON-lines file, optionally only those of a kind (or kinds) and job."""
    kinds = {kind} if isinstance(kind, str) else (set(kind) if kind else None)
    return [
        e
        for e in iter_events(path)
        if (kinds is None or e["kind"] in kinds) and (job is None or e.get("job") == job)
    ]


def replay(path, emitter, *, job=None) -> int:
    """Emits every event of a JSON-lines file again through `emitter` (a reporter),
    keeping ids and times, so a replay sent twice is stored once. Returns the count."""
    n = 0
    for e in iter_events(path):
        if job is not None and e.get("job") not in (None, job):
            continue
        emitter.emit(
            e["kind"],
            e.get("data") or {},
            ts=e["ts"],
            attempt=e.get("attempt"),
            node=e.get("node"),
            rank=e.get("rank"),
            event_id=e["id"],
        )
        n += 1
    return n


def make_sink(spec: dict | None, *, job, node=None, rank=None, attempt=None):
    """A sink from a launcher's spec: `{"events": PATH}` for a FileSink,
    `{"url": URL, "token": TOKEN}` for a reporter, `None` or `{}` for nothing.
    Both may be given: events then go to both."""
    spec = spec or {}
    sinks = []
    if spec.get("events"):
        sinks.append(FileSink(spec["events"], job, node=node, rank=rank, attempt=attempt))
    if spec.get("url"):
        from agent.reporter import Reporter  # only a process that posts needs it

        sinks.append(
            Reporter(
                url=spec["url"],
                token=spec.get("token") or os.environ.get("REBOUND_TOKEN", ""),
                job=job,
                node=node,
                rank=rank,
                attempt=attempt,
            )
        )
    if not sinks:
        return NullSink()
    return sinks[0] if len(sinks) == 1 else Tee(sinks)


class Tee:
    """Emits each event to several sinks under one id."""

    def __init__(self, sinks):
        self.sinks = list(sinks)

    def emit(self, kind, data=None, *, ts=None, attempt=None, node=None, rank=None, event_id=None):
        event_id = event_id or new_event_id()
        ts = time.time() if ts is None else ts
        for s in self.sinks:
            s.emit(kind, data, ts=ts, attempt=attempt, node=node, rank=rank, event_id=event_id)
        return event_id

    def flush(self, timeout_s: float = 10.0) -> bool:
        return all([s.flush(timeout_s) for s in self.sinks])

    def close(self, timeout_s: float = 10.0) -> None:
        for s in self.sinks:
            s.close(timeout_s)

    @property
    def stats(self) -> dict:
        return {type(s).__name__: s.stats for s in self.sinks}
