"""Storage upkeep (jobs.services.upkeep, incidents.upkeep): what it rolls up and drops
leaves every figure as it was: the ledger, the incidents with their times and costs,
the reliability report; after a detector rebuild and a resend of the whole stream too.

The trace is the detection scoreboard's (tests/incidents/test_fleet_scoreboard.py):
one job of 4 nodes x 8 GPUs for half a day, with stragglers, dead nodes, hangs and
crashes, replayed as production detects it; the horizons are shortened to fit it."""

import sys
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

from common.time import dt
from incidents.models import DetectorState, Incident, TimelineEntry
from incidents.services import incidents_detect_pass, incidents_update_figures
from incidents.tasks import storage_upkeep
from incidents.upkeep import incidents_storage_upkeep
from jobs import partitions
from jobs.models import (
    Cluster,
    Event,
    EvidenceWindow,
    HeartbeatBucket,
    RankWindow,
    RankWindowHour,
    StepRecord,
    StreamRollup,
    TrainingJob,
    UpkeepRun,
)
from jobs.services import events_ingest
from jobs.wire import validate_events

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from fleetsim.drive import replay
from fleetsim.score import ledger_seen, reliability_seen
from fleetsim.sim import simulate

from tests.incidents.test_fleet_scoreboard import CONFIG

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0  # a multiple of the bucket size
SHORT = {
    "REBOUND_KEEP_RANK_WINDOWS_S": 3600,
    "REBOUND_KEEP_HEARTBEAT_BUCKETS_S": 600,
    "REBOUND_KEEP_WINDOW_EVENTS_S": 60,
}
INCIDENT_FIELDS = [
    f.attname for f in Incident._meta.concrete_fields if f.name not in ("updated_at",)
]


def figures(keys: list[str]) -> dict:
    incidents = list(Incident.objects.order_by("id").values(*INCIDENT_FIELDS))
    for row, incident in zip(incidents, Incident.objects.order_by("id"), strict=True):
        row["nodes"] = sorted(n.name for n in incident.nodes.all())
    return {
        "incidents": incidents,
        "timeline": TimelineEntry.objects.count(),
        "ledger": ledger_seen(keys),
        "reliability": reliability_seen("fleet", CONFIG.days),
    }


def ingest_all(events: list[dict], at: float) -> None:
    cluster = Cluster.objects.get(name="fleet")
    for k in range(0, len(events), 1000):
        wire, errors = validate_events(events[k : k + 1000], 1000)
        assert not errors
        events_ingest(cluster=cluster, events=wire, received_at=dt(at))


def counts() -> dict:
    return {
        "windows": RankWindow.objects.count(),
        "buckets": HeartbeatBucket.objects.count(),
        "events": Event.objects.count(),
        "steps": StepRecord.objects.count(),
    }


def test_upkeep_leaves_every_figure_as_it_was():
    fleet = simulate(CONFIG)
    replay(fleet.events, cluster_name="fleet", tick_s=300, pass_every_s=600)
    keys = [j.key for j in fleet.jobs]
    job = TrainingJob.objects.get(key=keys[0])
    before = figures(keys)
    assert any(i["detector"] == "straggler" for i in before["incidents"])
    assert any(i["fault_type"] == "dead_node" for i in before["incidents"])
    raw = counts()
    assert not Event.objects.filter(kind="heartbeat").exists()  # never stored raw
    windows = list(
        RankWindow.objects.values_list("attempt", "node_id", "rank", "ts", "compute_s", "step_s")
    )

    end = job.last_event_ts
    # The raw windows' horizon cuts the longest straggler in two: a state rebuilt on the
    # windows kept sees only its second half.
    slow = max((f for f in fleet.faults if f.cls == "straggler"), key=lambda f: f.until - f.ts)
    horizon = {**SHORT, "REBOUND_KEEP_RANK_WINDOWS_S": end - (slow.ts + slow.until) / 2}
    with override_settings(**horizon):
        first = incidents_storage_upkeep(now=dt(end))
        second = incidents_storage_upkeep(now=dt(end + 120))
    kept = counts()
    report = first.report
    assert report["rank_windows_rolled"] > 0, report
    assert report["heartbeat_buckets_merged"] > 0.8 * raw["buckets"], report
    assert report["evidence_windows"] > 0, report
    assert report["waiting_for_detection"] == [], report
    assert second.report["stream_events_dropped"] > 0, second.report
    assert kept["windows"] == raw["windows"] - report["rank_windows_rolled"], (raw, kept)
    assert kept["buckets"] < 0.1 * raw["buckets"], (raw, kept)
    assert kept["steps"] == raw["steps"]
    assert RankWindowHour.objects.filter(job=job).count() == report["rank_window_hours"] > 0
    # An hour well behind the horizon, rolled up whole: its figures are its windows'.
    whole = int(end - horizon["REBOUND_KEEP_RANK_WINDOWS_S"]) // 3600 - 1
    checked = 0
    for h in RankWindowHour.objects.filter(job=job, hour__lt=whole):
        mine = [
            w for w in windows if (w[0], w[1], int(w[3] // 3600)) == (h.attempt, h.node_id, h.hour)
        ]
        computes = [w[4] for w in mine]
        assert h.windows == len(mine)
        assert h.compute_min_s == min(computes) and h.compute_max_s == max(computes)
        assert h.compute_mean_s == pytest.approx(sum(computes) / len(mine))
        assert h.step_mean_s == pytest.approx(sum(w[5] for w in mine) / len(mine))
        assert h.slowest_rank in {w[2] for w in mine if w[4] == h.compute_max_s}
        checked += 1
    assert checked >= 8
    assert EvidenceWindow.objects.filter(job=job).count() == report["evidence_windows"]
    # The raw events of windows before the first run went; steps' stay.
    assert not Event.objects.filter(kind="rank_window", id__lte=first.event_id_at_start).exists()
    assert Event.objects.filter(kind="step").count() == raw["steps"]
    assert Event.objects.filter(kind="checkpoint_saved").exists()
    assert figures(keys) == before

    # A pass over what is left changes nothing; nor does one from a state rebuilt on it.
    incidents_detect_pass(job=job)
    assert figures(keys) == before
    DetectorState.objects.filter(job=job).update(data={})
    job.refresh_from_db()
    incidents_detect_pass(job=job)
    incidents_update_figures(job=job)
    assert DetectorState.objects.get(job=job).data["partial"] is True
    assert figures(keys) == before

    # The whole stream sent again: nothing stored twice, nothing changed.
    ingest_all(fleet.events, end + 300)
    job.refresh_from_db()
    incidents_detect_pass(job=job)
    incidents_update_figures(job=job)
    again = counts()
    assert again["windows"] == kept["windows"]  # rolled-up windows not stored again
    assert again["steps"] == kept["steps"]
    assert figures(keys) == before

    # And upkeep over that is a no-op on the figures too.
    with override_settings(**horizon):
        incidents_storage_upkeep(now=dt(end + 600))
    assert figures(keys) == before


def test_upkeep_goes_no_further_than_detection_has_read():
    fleet = simulate(CONFIG)
    Cluster.objects.create(name="fleet")
    ingest_all(fleet.events, fleet.events[-1]["ts"])  # stored, never detected
    raw = counts()
    with override_settings(**SHORT):
        run = incidents_storage_upkeep(now=dt(fleet.events[-1]["ts"]))
    assert run.report["rank_windows_rolled"] == 0
    assert run.report["heartbeat_buckets_merged"] == 0
    assert run.report["waiting_for_detection"] == [fleet.jobs[0].key]
    assert counts() == raw
    assert StreamRollup.objects.get().waiting


def test_a_heartbeat_is_folded_into_its_bucket_not_stored(ingest):
    """A heartbeat sent twice is accepted twice and changes its bucket once: buckets
    keep the first and last heartbeat, which a copy cannot move."""
    beats = [
        {"id": f"hb-{k}", "kind": "heartbeat", "job": "j1", "ts": T0 + 5 * k, "node": "n1"}
        for k in range(6)
    ]
    for _ in range(2):
        r = ingest(beats)
        assert r.status_code == 202, r.content
        assert r.json() == {"accepted": 6, "duplicates": 0}
    assert not Event.objects.filter(kind="heartbeat").exists()
    rows = list(HeartbeatBucket.objects.order_by("bucket").values_list("first_ts", "last_ts"))
    assert rows == [(T0, T0 + 5), (T0 + 10, T0 + 15), (T0 + 20, T0 + 25)]
    assert TrainingJob.objects.get(key="j1").events_count == 0  # events stored
    # One with data (the Slurm hooks' node facts) is stored as an event as well.
    fact = {**beats[0], "id": "prolog", "data": {"slurm": {"hook": "prolog"}}}
    assert ingest([fact]).json() == {"accepted": 1, "duplicates": 0}
    assert ingest([fact]).json() == {"accepted": 0, "duplicates": 1}
    assert Event.objects.get(kind="heartbeat").data == fact["data"]


def test_the_beat_schedule_runs_upkeep_and_it_reports(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["storage-upkeep"]
    assert entry["task"] == "incidents.storage_upkeep"
    assert entry["schedule"] == settings.REBOUND_UPKEEP_EVERY_S
    storage_upkeep()
    run = UpkeepRun.objects.get()
    assert run.finished_at is not None
    assert run.report["jobs"] == 0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # outside a transaction, as the task runs
def test_on_postgresql_an_hour_past_the_horizon_goes_as_a_partition():
    """The hours of windows and buckets made ahead of the trace hold its rows; upkeep
    drops each hour of windows it rolled up whole, deleting no row of it, and puts each
    hour of buckets detection has read back as spans."""
    fleet = simulate(CONFIG)
    start = fleet.events[0]["ts"]
    ahead = int(CONFIG.days * 24) + 2
    made = partitions.hours_ensure(partitions.WINDOWS, start, ahead_h=ahead)
    assert partitions.hours_ensure(partitions.BEATS, start, ahead_h=ahead) == made
    assert len(made) >= 13
    replay(fleet.events, cluster_name="fleet", tick_s=300, pass_every_s=600)
    keys = [j.key for j in fleet.jobs]
    job = TrainingJob.objects.get(key=keys[0])
    before = figures(keys)
    with connection.cursor() as cur:
        for table in (partitions.WINDOWS, partitions.BEATS):
            cur.execute(f"SELECT count(*) FROM {table.default}")
            assert cur.fetchone()[0] == 0  # every row in its hour
    raw = counts()

    end = job.last_event_ts
    with override_settings(**SHORT):
        run = incidents_storage_upkeep(now=dt(end))
    report = run.report
    left = partitions.hours(partitions.WINDOWS)
    dropped = set(made) - set(left)
    assert report["window_hours_dropped"] == len(dropped) >= 8, report
    # Every hour that ended an hour before the horizon went (the last one may hold a
    # window still to be judged) ...
    cutoff = end - SHORT["REBOUND_KEEP_RANK_WINDOWS_S"]
    assert all((hour + 2) * 3600 > cutoff for hour in left), (left, cutoff)
    # ... whole: what is left of the raw windows is what the hours left hold.
    assert RankWindow.objects.count() == RankWindow.objects.filter(ts__gte=left[0] * 3600).count()
    assert RankWindow.objects.count() > raw["windows"] - report["rank_windows_rolled"]

    # The hours of buckets past their horizon (10 min) went; their spans stayed.
    beat_hours = partitions.hours(partitions.BEATS)
    assert report["beat_hours_rolled"] == len(set(made) - set(beat_hours)) >= 10, report
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {partitions.BEATS.default}")
        spans = cur.fetchone()[0]
    assert 0 < spans < 0.05 * raw["buckets"], (spans, raw)
    assert report["heartbeat_buckets_merged"] > 0.8 * raw["buckets"], report

    assert figures(keys) == before
    incidents_detect_pass(job=job)
    assert figures(keys) == before
    DetectorState.objects.filter(job=job).update(data={})  # rebuilt on what is left
    job.refresh_from_db()
    incidents_detect_pass(job=job)
    incidents_update_figures(job=job)
    assert figures(keys) == before
