"""The reporter's transport: posting batches to `POST /api/v1/ingest`, and what to do
with each answer (retry with backoff, drop what the console calls invalid, wait
while it refuses us). Standard library only.

It owns the HTTP connection (kept alive, reopened once when the console had
closed it), the request limits, the backoff policy, and the delivery counters
and their log lines. It does not own the events: `deliver` gets a list of queue
entries `(seq, class, json line)` and returns what it could not deliver.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

logger = logging.getLogger("rebound.agent")

INGEST_PATH = "/api/v1/ingest"
MAX_EVENTS_PER_REQUEST = 5000
# The console's limit is 5 MiB, compressed or not; keep a little headroom.
MAX_BODY_BYTES = 5 * 1024 * 1024 - 4096
BODY_OVERHEAD = len('{"events":[]}')
_MAX_RESPONSE_BYTES = 1 << 20
_RETRY_AFTER_MAX_S = 300.0


def retry_after(value: str | None) -> float | None:
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


def bad_indexes(body: bytes, n: int) -> set[int] | None:
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


def ingest_target(url: str) -> tuple[bool, str, str]:
    """(https?, host[:port], path) of the ingest endpoint under `url`; ValueError if unusable."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url must be http(s)://host[:port][/prefix], not {url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith(INGEST_PATH):
        path += INGEST_PATH
    return parts.scheme == "https", parts.netloc.rpartition("@")[2], path


class Transport:
    """Posts batches to the console and retries them until they are taken.

    Failed sends are retried with exponential backoff and jitter (`backoff_base_s`
    doubling up to `backoff_cap_s`), honouring Retry-After. Used by one sender
    thread; the counters are read from any thread (`counters`).
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float,
        backoff_base_s: float,
        backoff_cap_s: float,
        gzip_min_bytes: int,
        kept_in: str = "",
    ):
        self.url = url
        self._https, self._netloc, self._path = ingest_target(url)
        self._headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "rebound-agent/1",
        }
        self._timeout = timeout_s
        self._backoff_base = backoff_base_s
        self._backoff_cap = backoff_cap_s
        self._gzip_min = gzip_min_bytes
        self._kept_in = kept_in  # where undelivered events wait, for the log line
        self._conn: http.client.HTTPConnection | None = None

        self._lock = threading.RLock()  # re-entrant: the SIGTERM handler may run while held
        self.sent = 0
        self.duplicates = 0
        self.failures = 0
        self.rejected = 0
        self.last_error: str | None = None
        self._outage_logged = False
        self._refused_logged = False
        self._refused_streak = 0

    def counters(self) -> dict:
        with self._lock:
            return {
                "sent": self.sent,
                "duplicates": self.duplicates,
                "rejected": self.rejected,
                "failures": self.failures,
                "last_error": self.last_error,
            }

    def note_error(self, error: str) -> None:
        """Record a problem of the reporter's own (the spill file) as the last error."""
        with self._lock:
            self.last_error = error

    # ---- backoff ------------------------------------------------------------------------

    def backoff(self, n: int) -> float:
        delay = min(self._backoff_cap, self._backoff_base * 2 ** min(n, 32))
        return delay * (0.5 + random.random() / 2)

    def refused_delay(self) -> float:
        """The wait after another refusal in a row."""
        self._refused_streak += 1
        return self.backoff(self._refused_streak)

    def streak_delay(self) -> float:
        """The wait at the current refusal streak, not lengthening it."""
        return self.backoff(self._refused_streak)

    # ---- delivery -----------------------------------------------------------------------

    def deliver(
        self,
        entries: list,
        *,
        sleep: Callable[..., bool],
        abandoned: Callable[[], bool],
    ) -> tuple[list, bool]:
        """Send `entries` until the console took them all.

        `sleep(delay, interruptible=...)` waits out a backoff and answers whether the
        reporter is stopping; `abandoned()` whether its owner took the work back.
        Returns what is left undelivered and whether the console refused us
        (401/403/...: left) rather than the thread stopping.
        """
        work = [entries]
        failures_in_row = 0
        while work:
            if abandoned():
                return [], False
            chunk = work[0]
            try:
                status, headers, body = self.post(chunk)
            except (OSError, http.client.HTTPException) as exc:
                self._failed(f"{type(exc).__name__}: {exc}")
                if sleep(self.backoff(failures_in_row)):
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
                bad = bad_indexes(body, len(chunk))
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
                wait = retry_after(headers.get("Retry-After"))
                delay = self.backoff(failures_in_row)
                if wait is not None:
                    delay = max(wait, delay)  # never sooner than the console asked
                if sleep(delay, interruptible=wait is None):
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
            self.sent += accepted
            self.duplicates += duplicates
            if self._outage_logged or self._refused_logged:
                logger.warning("rebound reporter: the console takes events again")
            self._outage_logged = False
            self._refused_logged = False
            self._refused_streak = 0

    def _failed(self, error: str) -> None:
        with self._lock:
            self.failures += 1
            self.last_error = error
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
            self.failures += 1
            self.last_error = f"{status}: {text}"
            first = not self._refused_logged
            self._refused_logged = True
        if first:
            logger.error(
                "rebound reporter: the console at %s refused events with %d: %s -- "
                "events are kept in %s and retried with backoff; check the url, token and job",
                self.url,
                status,
                text,
                self._kept_in,
            )

    def _reject(self, entries, body: bytes, status: int = 400) -> None:
        ids = []
        for e in entries:
            try:
                ids.append(json.loads(e[2]).get("id"))
            except ValueError:
                ids.append(None)
        with self._lock:
            self.rejected += len(entries)
            self.last_error = f"{status}: {body[:300].decode(errors='replace')}"
        logger.error(
            "rebound reporter: the console refused %d event(s) %s with %d, dropped: %s",
            len(entries),
            ids[:20],
            status,
            body[:4000].decode(errors="replace"),
        )

    # ---- HTTP ---------------------------------------------------------------------------

    def _connect(self) -> http.client.HTTPConnection:
        if self._https:
            import ssl

            return http.client.HTTPSConnection(
                self._netloc, timeout=self._timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(self._netloc, timeout=self._timeout)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def after_fork_in_child(self) -> None:
        # The parent's connection and lock are not this process's to use.
        self._conn = None
        self._lock = threading.RLock()  # re-entrant: the SIGTERM handler may run while held

    def post(self, chunk) -> tuple[int, http.client.HTTPMessage, bytes]:
        """One request carrying `chunk`'s events: (status, headers, body)."""
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
                self.close()
                if fresh:
                    raise
                continue  # a kept-alive connection the console had closed: once more, anew
            except BaseException:
                self.close()
                raise
            if response.will_close or not response.isclosed():
                self.close()
            return response.status, response.headers, data
        raise ConnectionError("unreachable")  # pragma: no cover - the loop returns or raises
