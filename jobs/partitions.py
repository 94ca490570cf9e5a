"""The raw rank windows and heartbeat buckets on PostgreSQL: tables partitioned by the
hour of the job's clock, so that storage upkeep lets an hour go as one partition, not
row by row (jobs.services.upkeep):

- an hour of windows, once every job's windows in it are rolled up, is dropped;
- an hour of buckets, once detection has read it, is replaced by the spans of its
  buckets (jobs.services.upkeep.spans_of), which stay in the default partition under
  their first bucket's id.

Elsewhere (SQLite) the tables are plain and upkeep deletes rows. Upkeep makes the hours
ahead of the console's clock; a row outside every hour made (a job on another clock, a
replay of an old trace, the rows there before partitioning) lands in the default
partition, where upkeep deletes what it rolls up.

Partitioning asks every unique key to hold the partition key: the windows' are (id, ts)
and (job, attempt, rank, first_step, ts): a window sent again carries the same `ts`,
so the second key still refuses it. The buckets' (job, node, bucket) holds it already.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from django.db import DatabaseError, connection, transaction

from jobs.bulk import insert_ignoring_conflicts
from jobs.models import HeartbeatBucket

HOUR_S = 3600
# How long upkeep waits for a table lock (a long reader holds one) before leaving the
# hour to its next run, rather than hold ingest up in the queue behind it.
LOCK_WAIT = "2s"


@dataclass(frozen=True)
class Hourly:
    table: str
    column: str  # the partition key
    per_hour: int  # its units in an hour

    @property
    def default(self) -> str:
        return f"{self.table}_default"

    def name(self, hour: int) -> str:
        return f"{self.table}_h{hour}"


WINDOWS = Hourly("jobs_rankwindow", "ts", HOUR_S)
BEATS = Hourly("jobs_heartbeatbucket", "bucket", HOUR_S // 10)  # HeartbeatBucket.BUCKET_S


def partitioned() -> bool:
    return connection.vendor == "postgresql"


def hours(p: Hourly) -> list[int]:
    """The hours (floor(job clock / 3600)) that have a partition of their own, oldest first."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = %s::regclass",
            [p.table],
        )
        names = [r[0] for r in cur.fetchall()]
    prefix = f"{p.table}_h"
    return sorted(int(n[len(prefix) :]) for n in names if n.startswith(prefix))


def hours_ensure(p: Hourly, now_ts: float, ahead_h: int) -> list[int]:
    """Make the partitions of the hours from the last one to `ahead_h` past `now_ts`;
    the hours made. An hour the default partition holds rows of stays there."""
    made = []
    have = set(hours(p))
    first = math.floor(now_ts / HOUR_S) - 1
    with connection.cursor() as cur:
        for hour in range(first, first + ahead_h + 2):
            if hour in have:
                continue
            lo, hi = hour * p.per_hour, (hour + 1) * p.per_hour
            cur.execute(
                f"SELECT 1 FROM {p.default} WHERE {p.column} >= %s AND {p.column} < %s LIMIT 1",
                [lo, hi],
            )
            if cur.fetchone():
                continue
            try:
                # A row of that hour stored meanwhile fails it; a long reader of the
                # table makes it wait no longer than LOCK_WAIT: the next run tries again.
                with transaction.atomic():
                    cur.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
                    cur.execute(
                        f"CREATE TABLE {p.name(hour)} PARTITION OF {p.table}"
                        f" FOR VALUES FROM ({lo}) TO ({hi})"
                    )
            except DatabaseError:
                continue
            made.append(hour)
    return made


def window_hours_drop(rolled_upto: dict[int, int], before_ts: float) -> list[int]:
    """Drop the partitions of hours of windows ending by `before_ts` whose every row is
    rolled up (each job's rows up to `rolled_upto[job id]` are); the hours dropped.

    Dropping a partition locks the whole table for a moment (it cannot be detached
    concurrently while a default partition exists)."""
    dropped = []
    for hour in hours(WINDOWS):
        if (hour + 1) * HOUR_S > before_ts:
            break
        name = WINDOWS.name(hour)
        try:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
                # Locked before it is read: a late window cannot land in it unread.
                cur.execute(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE")
                cur.execute(f"SELECT job_id, max(id) FROM {name} GROUP BY job_id")
                if any(top > rolled_upto.get(job, 0) for job, top in cur.fetchall()):
                    continue
                cur.execute(f"DROP TABLE {name}")
        except DatabaseError:
            continue  # a lock not had in time: the next run tries again
        dropped.append(hour)
    return dropped


def beat_hours_roll(
    before_ts: float, spans_of: Callable[[list[tuple]], list[list] | None]
) -> Iterator[int]:
    """Replace each partition of an hour of buckets ending by `before_ts` with the spans
    `spans_of` makes of its rows ((id, job id, node, bucket, first_ts, last_ts) each;
    it answers [job id, id, node, bucket, first_ts, last_ts] rows, or None to leave the
    hour as it is); yields the hours replaced."""
    for hour in hours(BEATS):
        if (hour + 1) * HOUR_S > before_ts:
            break
        name = BEATS.name(hour)
        try:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
                cur.execute(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE")
                cur.execute(f"SELECT id, job_id, node, bucket, first_ts, last_ts FROM {name}")
                spans = spans_of(cur.fetchall())
                if spans is None:
                    continue
                # Detached, the hour's range belongs to the default partition: the
                # spans land there.
                cur.execute(f"ALTER TABLE {BEATS.table} DETACH PARTITION {name}")
                insert_ignoring_conflicts(
                    HeartbeatBucket,
                    ["job", "id", "node", "bucket", "first_ts", "last_ts"],
                    [[r[k] for r in spans] for k in range(6)],
                )
                cur.execute(f"DROP TABLE {name}")
        except DatabaseError:
            continue  # a lock not had in time: the next run tries again
        yield hour
