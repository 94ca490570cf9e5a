"""The metrics of one scrape, read from the database (and the broker and the cache):
gunicorn runs several processes, so counters kept in one process would each tell a
part. Never a stream table (events, steps, windows), and no scan of the incidents or
the actions on each scrape:

- live at every scrape: open incidents and unfinished actions and approvals (partial
  indexes on just those), recent jobs' ledgers (the jobs table: a row per job, not per
  event), the outbox due, the broker's queues;
- the totals over every job, incident and finished action (job counts, events
  stored, lost compute, the incident-time histograms, finished actions) come from a
  snapshot in the cache, read anew at most every REBOUND_METRICS_TOTALS_MAX_AGE_S
  (60 s) by whichever process scrapes first, and shared by all: so those counters lag
  by up to that long, which a `rate()` over minutes does not see.

Families are yielded by `ReboundCollector.collect` (prometheus_client's custom
collector protocol) into a registry of their own (`views.metrics`), never the
library's global one. A source that is away (the broker, the cache) leaves its
metrics out and says so in `rebound_scrape_errors{source}`; the database being away
fails the scrape (503), since then nothing could be said.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, Q, Sum
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from common.models import OutboxEntry
from console.metrics import refusals
from console.queues import queue_names
from incidents.models import Incident
from jobs.accounting import CATEGORIES
from jobs.models import Cluster, LedgerSnapshot, TrainingJob
from recovery.models import Action

logger = logging.getLogger(__name__)

GOOD = "productive"
BAD = tuple(c for c in CATEGORIES if c != GOOD)
# Upper bounds (seconds) of the incident-time histograms: a detection takes seconds to
# minutes, a resume or a recovery minutes to hours.
TIME_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400)
# Incident times: (metric suffix, the later time, what it measures).
INCIDENT_TIMES = (
    ("detect", "detected_at", "from the fault to its detection"),
    ("resume", "resumed_at", "from the fault to the first step of a later launch"),
    ("recover", "recovered_at", "from the fault to progress regained"),
)
# kombu's Redis transport keeps a queue's messages of priority p > 0 in the list
# "<queue>\x06\x16<p>" (kombu.transport.redis: PRIORITY_STEPS, Channel.sep).
KOMBU_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")
BROKER_TIMEOUT_S = 1.0
# The cache key of the totals' snapshot (one per database, should databases share a
# cache) and the version of its shape.
TOTALS_KEY = "metrics:totals:v1:{database}"


class ReboundCollector:
    """Reads Rebound's figures at each `collect()`; see the module's docstring."""

    def __init__(self, *, now=None):
        self.now = now or timezone.now()
        self.errors: dict[str, int] = {"broker": 0, "cache": 0}

    def collect(self):
        started = time.perf_counter()
        clusters = list(Cluster.objects.order_by("name").values_list("name", flat=True))
        totals = snapshot_totals(self.now)
        yield from self._jobs(totals)
        yield from self._ledgers()
        yield from self._incidents(totals)
        yield from self._actions(clusters, totals)
        yield from self._outbox()
        yield from self._queues()
        yield from self._refusals()
        errors = GaugeMetricFamily(
            "rebound_scrape_errors",
            "Sources this scrape could not read (1): their metrics are absent from it.",
            labels=["source"],
        )
        for source, failed in sorted(self.errors.items()):
            errors.add_metric([source], failed)
        yield errors
        yield GaugeMetricFamily(
            "rebound_scrape_duration_seconds",
            "How long the server took to read this scrape's figures.",
            value=time.perf_counter() - started,
        )

    # --- jobs and their ledgers --------------------------------------------------

    def _jobs(self, totals: dict):
        by_status = GaugeMetricFamily(
            "rebound_jobs",
            "Training jobs by cluster and status (from the totals' snapshot).",
            labels=["cluster", "status"],
        )
        events = CounterMetricFamily(
            "rebound_ingest_events",
            "Events ingested and stored (duplicates not counted), by cluster: the sum of"
            " the jobs' event counts (from the totals' snapshot).",
            labels=["cluster"],
        )
        stored: dict[str, int] = defaultdict(int)
        for cluster, status, n, count in totals["jobs"]:
            by_status.add_metric([cluster, status], n)
            stored[cluster] += count or 0
        for cluster, count in stored.items():
            events.add_metric([cluster], count)
        yield by_status
        yield events

    def _ledgers(self):
        """Each recent job's stored ledger (jobs.services.ledger): running, or heard from
        or finished within REBOUND_METRICS_JOB_HORIZON_S, so that old jobs do not
        grow the series without bound."""
        since = self.now - timedelta(seconds=settings.REBOUND_METRICS_JOB_HORIZON_S)
        labels = ["job_key", "cluster"]
        fam = {
            "good": GaugeMetricFamily(
                "rebound_job_goodput_seconds",
                "Productive time of the job's ledger: steps whose results were kept.",
                labels=labels,
            ),
            "bad": GaugeMetricFamily(
                "rebound_job_badput_seconds",
                "Time of the job's ledger in each badput category.",
                labels=[*labels, "category"],
            ),
            "good_gpu": GaugeMetricFamily(
                "rebound_job_goodput_gpu_seconds",
                "Productive GPU-seconds of the job's ledger.",
                labels=labels,
            ),
            "bad_gpu": GaugeMetricFamily(
                "rebound_job_badput_gpu_seconds",
                "GPU-seconds of the job's ledger in each badput category.",
                labels=[*labels, "category"],
            ),
            "elapsed": GaugeMetricFamily(
                "rebound_job_elapsed_seconds",
                "The job's elapsed time: goodput and every badput category together.",
                labels=labels,
            ),
            "elapsed_gpu": GaugeMetricFamily(
                "rebound_job_elapsed_gpu_seconds",
                "The job's elapsed GPU-seconds: goodput and every badput category together.",
                labels=labels,
            ),
            "slowdown": GaugeMetricFamily(
                "rebound_job_slowdown_seconds",
                "Time lost to slow productive steps (not part of the categories).",
                labels=labels,
            ),
        }
        rows = (
            LedgerSnapshot.objects.filter(
                Q(job__status=TrainingJob.Status.RUNNING)
                | Q(job__last_received_at__gte=since)
                | Q(job__finished_at__gte=since)
            )
            .values_list("job__key", "job__cluster__name", "figures")
            .order_by("job__key")
        )
        for key, cluster, figures in rows:
            seconds = figures.get("categories") or {}
            gpu = figures.get("gpu_seconds") or {}
            at = [key, cluster]
            fam["good"].add_metric(at, float(seconds.get(GOOD, 0.0)))
            fam["good_gpu"].add_metric(at, float(gpu.get(GOOD, 0.0)))
            for category in BAD:
                fam["bad"].add_metric([*at, category], float(seconds.get(category, 0.0)))
                fam["bad_gpu"].add_metric([*at, category], float(gpu.get(category, 0.0)))
            fam["elapsed"].add_metric(at, float(figures.get("elapsed_s") or 0.0))
            fam["elapsed_gpu"].add_metric(at, float(sum(gpu.get(c, 0.0) for c in CATEGORIES)))
            fam["slowdown"].add_metric(at, float(figures.get("slowdown_s") or 0.0))
        yield from fam.values()

    # --- incidents -------------------------------------------------------------------

    def _incidents(self, totals: dict):
        open_ = GaugeMetricFamily(
            "rebound_incidents_open",
            "Incidents open (not yet recovered or resolved), by cluster, cause and severity.",
            labels=["cluster", "cause", "severity"],
        )
        rows = (
            Incident.objects.filter(state__in=Incident.OPEN_STATES)  # incident_open index
            .values_list("cluster__name", "cause", "severity")
            .annotate(n=Count("id"))
            .order_by("cluster__name", "cause", "severity")
        )
        for cluster, cause, severity, n in rows:
            open_.add_metric([cluster, cause, severity], n)
        yield open_
        lost = CounterMetricFamily(
            "rebound_incident_lost_gpu_seconds",
            "GPU-seconds lost to incidents (their badput), by cluster and cause; divide by"
            " 3600 for GPU-hours (from the totals' snapshot).",
            labels=["cluster", "cause"],
        )
        for cluster, cause, seconds in totals["lost"]:
            lost.add_metric([cluster, cause], seconds)
        yield lost
        for name, _, what in INCIDENT_TIMES:
            fam = HistogramMetricFamily(
                f"rebound_incident_time_to_{name}_seconds",
                f"Incidents' time to {name}: {what}; every incident with that time (from"
                " the totals' snapshot).",
                labels=["cluster"],
            )
            for cluster, acc in totals["times"][name]:
                buckets = [(str(float(b)), acc[i]) for i, b in enumerate(TIME_BUCKETS_S)]
                buckets.append(("+Inf", acc[-2]))
                fam.add_metric([cluster], buckets, sum_value=acc[-1])
            yield fam

    # --- actions and approvals ---------------------------------------------------------

    def _actions(self, clusters: list[str], totals: dict):
        active = GaugeMetricFamily(
            "rebound_actions",
            "Actions not finished, by cluster, kind and state.",
            labels=["cluster", "kind", "state"],
        )
        finished = CounterMetricFamily(
            "rebound_actions_finished",
            "Actions that ended, by cluster, kind and final state (from the totals' snapshot).",
            labels=["cluster", "kind", "state"],
        )
        for cluster, kind, state, n in totals["actions_finished"]:
            finished.add_metric([cluster, kind, state], n)
        waiting = GaugeMetricFamily(
            "rebound_approvals_waiting",
            "Actions awaiting an operator's approval, by cluster.",
            labels=["cluster"],
        )
        oldest_age = GaugeMetricFamily(
            "rebound_approvals_oldest_age_seconds",
            "Age of the oldest action awaiting approval, by cluster (absent when none waits).",
            labels=["cluster"],
        )
        waiting_n = dict.fromkeys(clusters, 0)
        oldest: dict[str, object] = {}
        rows = (
            Action.objects.filter(state__in=Action.ACTIVE_STATES)  # the action_active index
            .values_list("cluster__name", "kind", "state")
            .annotate(n=Count("id"), first=Min("created_at"))
            .order_by("cluster__name", "kind", "state")
        )
        for cluster, kind, state, n, first in rows:
            active.add_metric([cluster, kind, state], n)
            if state == Action.State.AWAITING_APPROVAL:
                waiting_n[cluster] = waiting_n.get(cluster, 0) + n
                oldest[cluster] = min(first, oldest.get(cluster, first))
        for cluster, n in sorted(waiting_n.items()):
            waiting.add_metric([cluster], n)
        for cluster, first in sorted(oldest.items()):
            oldest_age.add_metric([cluster], max(0.0, (self.now - first).total_seconds()))
        yield from (active, finished, waiting, oldest_age)

    # --- background work ---------------------------------------------------------------

    def _outbox(self):
        due = OutboxEntry.objects.filter(due_at__lte=self.now).aggregate(
            n=Count("id"), oldest=Min("due_at")
        )
        yield GaugeMetricFamily(
            "rebound_outbox_due",
            "Outbox entries past their due time: work not yet taken by a worker.",
            value=due["n"],
        )
        oldest = due["oldest"]
        yield GaugeMetricFamily(
            "rebound_outbox_oldest_due_age_seconds",
            "How long the oldest outbox entry is past its due time (0 when none is).",
            value=0.0 if oldest is None else max(0.0, (self.now - oldest).total_seconds()),
        )

    def _queues(self):
        """Each Celery queue's length on a Redis broker. The family is always there (a
        dashboard's query stays valid); its samples are absent with another broker, and
        with a Redis that does not answer (rebound_scrape_errors{source="broker"})."""
        fam = GaugeMetricFamily(
            "rebound_celery_queue_length",
            "Messages waiting in each Celery queue on the broker (not yet taken by a worker).",
            labels=["queue"],
        )
        url = settings.CELERY_BROKER_URL
        if url.startswith(("redis://", "rediss://", "unix://")):
            names = queue_names(settings.CELERY_TASK_DEFAULT_QUEUE)
            try:
                lengths = broker_queue_lengths(url, names)
            except Exception as exc:  # any failure of the broker leaves its samples out
                self.errors["broker"] = 1
                logger.warning("metrics: the broker did not answer: %s", exc)
            else:
                for name in names:
                    fam.add_metric([name], lengths[name])
        yield fam

    def _refusals(self):
        fam = CounterMetricFamily(
            "rebound_ingest_refused_requests",
            "Ingest requests refused, by reason (the error's code); kept in the cache, so"
            " it restarts from 0 when the cache is emptied.",
            labels=["reason"],
        )
        try:
            counts = refusals.counts()
        except Exception as exc:  # a cache that is away: no samples, not a false reset to 0
            self.errors["cache"] = 1
            logger.warning("metrics: the cache did not answer: %s", exc)
            counts = {}
        for reason, n in counts.items():
            fam.add_metric([reason], n)
        yield fam


# --- the totals' snapshot -----------------------------------------------------------------


def snapshot_totals(now) -> dict:
    """The totals (see the module's docstring): the cache's snapshot while it is younger
    than REBOUND_METRICS_TOTALS_MAX_AGE_S, else read anew and put there. A cache that is
    away misses: each scrape then reads them itself, as with a max age of 0."""
    max_age = settings.REBOUND_METRICS_TOTALS_MAX_AGE_S
    key = TOTALS_KEY.format(database=connection.settings_dict["NAME"])
    if max_age > 0:
        kept = cache.get(key)
        if kept is not None and 0 <= now.timestamp() - kept["at"] < max_age:
            return kept
    totals = read_totals()
    totals["at"] = now.timestamp()
    if max_age > 0:
        cache.set(key, totals, timeout=max_age)
    return totals


def forget_totals() -> None:
    """Drop the snapshot, so that the next scrape reads the totals anew."""
    cache.delete(TOTALS_KEY.format(database=connection.settings_dict["NAME"]))


def read_totals() -> dict:
    """One pass over jobs, incidents and finished actions: aggregate queries, each
    histogram bucket a filtered count (never a row per incident). Plain lists, for the
    cache."""
    jobs = list(
        TrainingJob.objects.values_list("cluster__name", "status")
        .annotate(n=Count("id"), events=Sum("events_count"))
        .order_by("cluster__name", "status")
    )
    durations = {
        name: ExpressionWrapper(F(later) - F("fault_at"), output_field=DurationField())
        for name, later, _ in INCIDENT_TIMES
    }
    aggregates = {"lost": Sum("lost_gpu_seconds")}
    for name, later, _ in INCIDENT_TIMES:
        known = Q(**{f"{later}__isnull": False})
        aggregates[f"{name}_n"] = Count("id", filter=known)
        aggregates[f"{name}_sum"] = Sum(f"t_{name}", filter=known)
        for i, bound in enumerate(TIME_BUCKETS_S):
            aggregates[f"{name}_{i}"] = Count(
                "id", filter=known & Q(**{f"t_{name}__lte": timedelta(seconds=bound)})
            )
    rows = (
        Incident.objects.alias(**{f"t_{name}": d for name, d in durations.items()})
        .values("cluster__name", "cause")
        .annotate(**aggregates)
        .order_by("cluster__name", "cause")
    )
    lost = []
    # Per time: {cluster: [bucket counts..., count, sum]}.
    times: dict[str, dict[str, list]] = {name: {} for name, _, _ in INCIDENT_TIMES}
    for row in rows:
        cluster = row["cluster__name"]
        lost.append((cluster, row["cause"], row["lost"] or 0.0))
        for name, _, _ in INCIDENT_TIMES:
            acc = times[name].setdefault(cluster, [0] * len(TIME_BUCKETS_S) + [0, 0.0])
            for i in range(len(TIME_BUCKETS_S)):
                acc[i] += row[f"{name}_{i}"]
            acc[-2] += row[f"{name}_n"]
            total = row[f"{name}_sum"]
            acc[-1] += total.total_seconds() if total is not None else 0.0
    finished = list(
        Action.objects.filter(state__in=Action.TERMINAL_STATES)
        .values_list("cluster__name", "kind", "state")
        .annotate(n=Count("id"))
        .order_by("cluster__name", "kind", "state")
    )
    return {
        "jobs": jobs,
        "lost": lost,
        "times": {name: sorted(by.items()) for name, by in times.items()},
        "actions_finished": finished,
    }


_clients: dict[str, object] = {}


def broker_queue_lengths(url: str, names: list[str]) -> dict[str, int]:
    """Messages in each queue on a Redis broker, every priority's list summed: one round
    trip. Raises when the broker does not answer within BROKER_TIMEOUT_S."""
    import redis

    client = _clients.get(url)
    if client is None:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=BROKER_TIMEOUT_S, socket_timeout=BROKER_TIMEOUT_S
        )
        _clients[url] = client
    pipe = client.pipeline(transaction=False)
    for name in names:
        for suffix in KOMBU_PRIORITY_SUFFIXES:
            pipe.llen(name + suffix)
    answers = pipe.execute()
    step = len(KOMBU_PRIORITY_SUFFIXES)
    return {name: sum(answers[i * step : (i + 1) * step]) for i, name in enumerate(names)}
