"""Replay a simulated fleet through the real ingest and detection, on the simulated clock.

Needs Django set up. The events go in time order, in ticks of `tick_s` simulated
seconds, through `validate_events` and `events_ingest` (what the API view calls),
one request per tick (at most 5,000 events each), stamped as received at the
tick's end: `events_ingest(received_at=...)`, the replay's stand-in for the
server's clock, so the jobs' last_received_at and the nodes' last_heard_at that
the sweep judges silence by follow the simulated clock. The API never passes it.

After each tick the driver does what the worker does after ingest
(incidents.receivers): a quick pass (reported faults only) for jobs whose new
events can open an episode, and a full pass for every job with new events at most
once per `pass_every_s` (production's DEBOUNCE_S by default; longer saves time:
an inferred fault's detected time is on the job's clock, so a sparser pass moves
only its `opened_at`); then the sweep with `now` the tick's end. A sweep counts its
run as unbroken only when it ran within 3 x SWEEP_EVERY_S: for ticks longer than
that the driver records the sweep as having run SWEEP_EVERY_S before (what the
sweeps in between leave behind; tests/incidents/test_sweep.py does the same), so
what those sweeps would have found is found at the tick. Detected times are on the
job's clock either way; only `opened_at` carries the tick.

The ingest's own follow-up work (the outbox's `jobs.events_stored`) is left in
the outbox: the driver runs the passes itself, in simulated time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

from common.time import dt
from incidents.models import SweepState
from incidents.receivers import DEBOUNCE_S, EPISODE_KINDS
from incidents.services import (
    SWEEP_EVERY_S,
    incidents_detect_pass,
    incidents_sweep,
    incidents_update_figures,
)
from jobs.models import Cluster, TrainingJob
from jobs.services import events_ingest
from jobs.wire import validate_events

MAX_BATCH = 5000


@dataclass
class DriveStats:
    events: int = 0
    requests: int = 0
    quick_passes: int = 0
    full_passes: int = 0
    sweeps: int = 0
    wall_s: float = 0.0


def replay(
    events: list[dict],
    *,
    cluster_name: str,
    tick_s: float = 60.0,
    pass_every_s: float = DEBOUNCE_S,
) -> DriveStats:
    """Ingest `events` (sorted by ts) tick by tick, detecting as production does."""
    began = time.monotonic()
    stats = DriveStats()
    cluster, _ = Cluster.objects.get_or_create(name=cluster_name)
    jobs: dict[str, TrainingJob] = {}
    last_full: dict[str, float] = {}
    i, n = 0, len(events)
    tick_end = events[0]["ts"] + tick_s if events else 0.0
    while i < n:
        j = i
        while j < n and events[j]["ts"] < tick_end:
            j += 1
        if j > i:
            _ingest(cluster, events[i:j], tick_end, stats)
            kinds: dict[str, set[str]] = {}
            for e in events[i:j]:
                kinds.setdefault(e["job"], set()).add(e["kind"])
            for key, ks in sorted(kinds.items()):
                job = jobs.get(key) or TrainingJob.objects.get(key=key)
                jobs[key] = job
                job.refresh_from_db()
                if ks & EPISODE_KINDS:
                    incidents_detect_pass(job=job, inferred=False)
                    stats.quick_passes += 1
                if tick_end - last_full.get(key, -1e18) >= pass_every_s:
                    incidents_detect_pass(job=job)
                    last_full[key] = tick_end
                    stats.full_passes += 1
        _sweep(tick_end, tick_s)
        stats.sweeps += 1
        stats.events += j - i
        i = j
        tick_end += tick_s
    for job in jobs.values():  # what the last ledger refresh and pass leave behind
        job.refresh_from_db()
        incidents_detect_pass(job=job)
        incidents_update_figures(job=job)
    stats.wall_s = time.monotonic() - began
    return stats


def _ingest(cluster: Cluster, batch: list[dict], tick_end: float, stats: DriveStats) -> None:
    for k in range(0, len(batch), MAX_BATCH):
        wire, errors = validate_events(batch[k : k + MAX_BATCH], MAX_BATCH)
        if errors:
            raise ValueError(f"the simulator emitted events the server refuses: {errors[:5]}")
        events_ingest(cluster=cluster, events=wire, received_at=dt(tick_end))
        stats.requests += 1


def _sweep(now_ts: float, tick_s: float) -> None:
    now = dt(now_ts)
    if tick_s > 3 * SWEEP_EVERY_S:
        SweepState.objects.filter(pk=1).update(at=now - timedelta(seconds=SWEEP_EVERY_S))
    incidents_sweep(now=now)
