"""The job page: every chart built on the server from reduced series, bounded whatever
the job's size, keeping what matters (a loss spike, a rollback, a slow step), with a
query count that does not grow with the job; the what-if panel; the capped tables."""

import itertools
import json
import math
import re
from datetime import UTC, datetime

import numpy as np
import pytest
from django.core.cache import cache
from django.test.utils import CaptureQueriesContext

from console import whatif
from console.charts import CATEGORY_COLOURS, MAX_POINTS
from incidents import services as incident_services
from incidents.models import Incident
from jobs import selectors
from jobs.accounting import CATEGORIES
from jobs.models import TrainingJob
from jobs.services import (
    cluster_get_or_create,
    events_ingest,
    job_reopen,
    ledger_snapshot_ensure,
    step_buckets_ensure,
)
from jobs.wire import validate_events
from tests.factories import TrainingJobFactory

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0
CKPT_EVERY = 100
WINDOW_EVERY = 100
RANKS = 4
SPIKE = 100.0  # a loss spike in a kept step
THROWN_SPIKE = 50.0  # a loss spike in steps a later launch ran again
SLOW_STEP_S = 30.0
# The page's queries, whatever the job's size: session, user, role, the header's
# badges, the job and its summary, the step buckets, launches and their nodes,
# incidents, checkpoints, the ranks (with the ledger's snapshot current).
MAX_QUERIES = 22


def job_events(
    key: str,
    *,
    launches: int,
    steps_per_launch: int,
    spikes: bool = False,
) -> list[dict]:
    """A job of `launches` launches: each runs `steps_per_launch` new steps and 37
    more past its last checkpoint, then fails (the last completes); the next resumes
    at the latest durable checkpoint, the second one at an older one (a rollback).
    Loss and step time are reported; rank 3 computes slowly in launch 1. With
    `spikes`: a loss spike in the last launch (kept) and in launch 1's steps that the
    next launch runs again (thrown away), and a slow step in the last launch."""
    events: list[dict] = []
    t = T0

    def emit(kind, attempt, **data):
        extra = data.pop("_extra", {})
        events.append(
            {
                "id": f"{key}-{len(events):07d}",
                "job": key,
                "kind": kind,
                "ts": round(t, 6),
                "data": data,
                **({"attempt": attempt} if attempt is not None else {}),
                **extra,
            }
        )

    checkpoints: list[int] = []
    step = 0
    for n in range(1, launches + 1):
        nodes = [f"{key}-n{n % 3}a", f"{key}-n{n % 3}b"]
        emit("attempt_started", n, world_size=RANKS, gpus_per_node=2, nodes=nodes)
        t += 30.0
        emit("ready", n)
        if checkpoints:
            step = checkpoints[-2] if n == 2 and len(checkpoints) > 1 else checkpoints[-1]
            emit("checkpoint_load_started", n, step=step)
            t += 10.0
            emit("checkpoint_loaded", n, step=step)
        last = n == launches
        target = (step // CKPT_EVERY + 1) * CKPT_EVERY + steps_per_launch
        stop = target if last else target + 37
        resumed = step
        while step < stop:
            step += 1
            dt = SLOW_STEP_S if spikes and last and step == resumed + 80 else 1.0
            t += dt
            loss = 3.0 * math.exp(-step / 20_000) + 0.01 * math.sin(step)
            if spikes and last and step == resumed + 50:
                loss = SPIKE
            if spikes and n == 1 and step == stop - 10:
                loss = THROWN_SPIKE
            emit("step", n, step=step, loss=round(loss, 6), step_time_s=dt, _extra={"rank": 0})
            if step % WINDOW_EVERY == 0:
                for rank in range(RANKS):
                    compute = 0.9 if (n == 1 and rank == 3) else 0.6
                    emit(
                        "rank_window",
                        n,
                        first_step=step - WINDOW_EVERY + 1,
                        last_step=step,
                        compute_s=compute,
                        step_s=1.0,
                        comm_wait_s=1.0 - compute,
                        _extra={"rank": rank, "node": nodes[rank // 2]},
                    )
            if step % CKPT_EVERY == 0:
                emit("checkpoint_save_started", n, step=step)
                t += 2.0
                emit("checkpoint_saved", n, step=step, blocking_s=2.0, tier="remote")
                if step not in checkpoints:
                    checkpoints.append(step)
                    checkpoints.sort()
        if last:
            t += 3.0
            emit("attempt_ended", n, reason="completed")
            emit("job_finished", n)
        else:
            t += 4.0
            emit("fault", n, type="gpu_xid", xid=79, _extra={"node": nodes[1]})
            t += 20.0
            emit("attempt_ended", n, reason="failed")
            t += 60.0
    return events


def ingest_job(key: str, **kwargs) -> TrainingJob:
    cluster = cluster_get_or_create(name="east")
    raw = job_events(key, **kwargs)
    for i in range(0, len(raw), 5000):
        events, errors = validate_events(raw[i : i + 5000], 5000)
        assert not errors, errors[:3]
        events_ingest(cluster=cluster, events=events)
    job = TrainingJob.objects.get(key=key)
    incident_services.incidents_detect(job=job)  # as the task does after ingest
    return job


def charts(html: str) -> dict[str, dict]:
    """The figures the page embeds for console.js, by the div they draw in."""
    found = re.findall(
        r'<script type="application/json" id="[^"]+" data-chart="([^"]+)">(.*?)</script>',
        html,
        re.S,
    )
    return {div: json.loads(body) for div, body in found}


def trace(fig: dict, name_start: str) -> dict:
    return next(t for t in fig["data"] if t["name"].startswith(name_start))


@pytest.fixture
def viewer(client, personas):
    client.force_login(personas["viewer"].user)
    return client


@pytest.fixture
def small(db):
    return ingest_job("small-job", launches=3, steps_per_launch=150)


@pytest.fixture
def big(db):
    # 20,000 and some steps in 30 launches, with 29 failures and their incidents.
    return ingest_job(
        "big-job",
        launches=30,
        steps_per_launch=570,
        spikes=True,
    )


def test_every_chart_is_drawn_from_a_server_built_figure(viewer, small):
    r = viewer.get("/jobs/small-job/")
    assert r.status_code == 200
    html = r.content.decode()
    assert "vendor/plotly.min.js" in html and "css/job.css" in html
    figs = charts(html)
    assert set(figs) == {
        "chart-badput",
        "chart-goodput",
        "chart-progress",
        "chart-loss",
        "chart-steptime",
        "chart-ranks",
    }
    for div, fig in figs.items():
        assert f'id="{div}"' in html
        layout = fig["layout"]
        assert layout["title"]["text"], div
        assert layout["xaxis"]["title"]["text"] and layout["yaxis"]["title"]["text"], div
        assert layout["showlegend"] is True

    # GPU-hours by category, stacked, in the category colours; below, the badput alone.
    figures = selectors.job_goodput(job=small)
    bars = figs["chart-badput"]["data"]
    top = [b for b in bars if b["y"] == ["all"]]
    below = [b for b in bars if b["y"] == ["badput only"]]
    assert [b["name"] for b in top] == [c.replace("_", " ") for c in CATEGORIES]
    assert [b["name"] for b in below] == [c.replace("_", " ") for c in CATEGORIES[1:]]
    for bar, name in zip(top, CATEGORIES, strict=True):
        assert bar["marker"]["color"] == CATEGORY_COLOURS[name]
        assert bar["x"][0] == pytest.approx(figures["gpu_seconds"][name] / 3600, abs=1e-4)
    assert figs["chart-badput"]["layout"]["barmode"] == "stack"
    assert sum(b["x"][0] for b in below) == pytest.approx(
        (sum(figures["gpu_seconds"].values()) - figures["gpu_seconds"]["productive"]) / 3600,
        abs=1e-3,
    )

    # Progress: a shaded rectangle per launch, a marker and a line per incident, the
    # durable checkpoints marked.
    progress = figs["chart-progress"]
    rects = [s for s in progress["layout"]["shapes"] if s["type"] == "rect"]
    assert [s["label"]["text"] for s in rects] == ["launch 1", "launch 2", "launch 3"]
    incidents = Incident.objects.filter(job=small)
    assert incidents.count() == 2  # the two failed launches
    marks = trace(progress, "incident")
    assert len(marks["x"]) == 2 and all(i.summary[:30] in "".join(marks["text"]) for i in incidents)
    durable = trace(progress, "checkpoint (durable)")
    saved = sorted(small.checkpoints.filter(durable=True).values_list("step", flat=True))
    assert len(saved) >= 5 and sorted(durable["y"]) == saved

    # Goodput over time ends at the ledger's cumulative goodput.
    goodput = figs["chart-goodput"]
    cumulative = trace(goodput, "cumulative")["y"]
    assert cumulative[-1] == pytest.approx(100 * figures["goodput"], abs=0.01)
    assert all(0 <= v <= 100 for v in trace(goodput, "sliding")["y"])


def test_a_big_job_sends_bounded_series_that_keep_its_spike_rollback_and_slow_step(viewer, big):
    assert big.steps.count() > 20_000
    r = viewer.get("/jobs/big-job/")
    assert r.status_code == 200
    figs = charts(r.content.decode())
    for div, fig in figs.items():
        for t in fig["data"]:
            for axis in ("x", "y"):
                assert len(t.get(axis) or []) <= MAX_POINTS, (div, t["name"], axis)
    heat = figs["chart-ranks"]["data"][0]
    assert len(heat["x"]) <= 200 and len(heat["z"]) == RANKS

    # The spike of a kept step is the loss band's top; the one a rollback threw away
    # is the top of the thrown-away executions' range.
    loss = figs["chart-loss"]
    assert max(v for v in trace(loss, "kept: max")["y"] if v is not None) == SPIKE
    thrown = trace(loss, "run again later")
    assert max(hi for _, hi in thrown["customdata"]) == THROWN_SPIKE
    assert max(y + e for y, e in zip(thrown["y"], thrown["error_y"]["array"], strict=True)) == (
        pytest.approx(THROWN_SPIKE)
    )

    # A rollback: the step reached goes back between launches.
    steps = [y for y in trace(figs["chart-progress"], "step reached")["y"] if y is not None]
    assert any(b < a for a, b in itertools.pairwise(steps))
    assert max(steps) == big.last_step

    # The slow step is marked, with the rule in the title.
    step_time = figs["chart-steptime"]
    slow = trace(step_time, "slow")
    assert SLOW_STEP_S in slow["y"]
    assert "2x the rolling median" in step_time["layout"]["title"]["text"]

    # Goodput over time still ends at the ledger's figure.
    figures = selectors.job_goodput(job=big)
    cumulative = trace(figs["chart-goodput"], "cumulative")["y"]
    assert cumulative[-1] == pytest.approx(100 * figures["goodput"], abs=0.01)

    # The tables are capped, and say so.
    html = r.content.decode()
    assert "Showing the latest 25 of 30, newest first." in html
    total = big.checkpoints.count()
    assert f"Showing the latest 25 of {total}, newest first." in html


def test_the_query_count_does_not_grow_with_steps_launches_checkpoints_or_incidents(
    client, personas, small, big, django_assert_max_num_queries
):
    client.force_login(personas["viewer"].user)
    # Many more incidents on the big job (stragglers, say), and a cold cache for both.
    now = datetime.now(tz=UTC)
    Incident.objects.bulk_create(
        [
            Incident(
                job=big,
                cluster=big.cluster,
                detector="test",
                episode=str(k),
                attempt=30,
                cause=Incident.Cause.STRAGGLER,
                severity=Incident.Severity.MINOR,
                summary=f"rank 3 slow ({k})",
                fault_at=now,
                detected_at=now,
            )
            for k in range(250)
        ]
    )
    cache.clear()
    counts = {}
    for job in (small, big):
        ledger_snapshot_ensure(job=job)  # the snapshot the ledger refresh task keeps
        with (
            CaptureQueriesContext(client_connection()) as queries,
            django_assert_max_num_queries(MAX_QUERIES),
        ):
            assert client.get(f"/jobs/{job.key}/").status_code == 200
        counts[job.key] = len(queries)
    # The big job's only extra query counts its incidents: it has more than the page lists.
    assert counts["big-job"] <= counts["small-job"] + 1, counts


def client_connection():
    from django.db import connection

    return connection


def test_the_buckets_are_brought_up_to_date_with_what_ingest_adds(small):
    cache.clear()
    first = step_buckets_ensure(job=small)  # cached now
    assert first.step_width == 1
    # Another launch, long enough that the buckets coarsen: steps from the old launches
    # are never read again, only the new rows. The job had finished: an operator
    # reopens it first (a new launch of a finished job is refused otherwise).
    job_reopen(job=small, actor="operator", reason="one more launch")
    cluster = cluster_get_or_create(name="east")
    more = [
        e
        for e in job_events("small-job", launches=4, steps_per_launch=3_000)
        if e.get("attempt") == 4
    ]
    for e in more:
        e["id"] += "-more"
    for i in range(0, len(more), 5000):
        events, errors = validate_events(more[i : i + 5000], 5000)
        assert not errors
        events_ingest(cluster=cluster, events=events)
    job = TrainingJob.objects.get(pk=small.pk)
    updated = selectors.job_step_buckets(job=job)
    assert updated.step_width > first.step_width
    cache.clear()
    cold = selectors.job_step_buckets(job=job)
    assert (updated.step_width, updated.time_width) == (cold.step_width, cold.time_width)
    assert updated.rows.shape == cold.rows.shape
    assert np.allclose(updated.rows, cold.rows, equal_nan=True)
    assert int(updated.col("n").sum()) == job.steps.count()


def test_what_if_uses_the_jobs_own_measurements(viewer, small):
    r = viewer.get("/jobs/small-job/")
    panel = r.context["whatif"]
    figures = selectors.job_goodput(job=small)
    inputs = panel["result"]["inputs"]
    assert panel["failures"] == 2
    assert inputs["mtbf"].source == "measured"
    assert inputs["mtbf"].value == pytest.approx(figures["elapsed_s"] / 2)
    cats = figures["categories"]
    assert inputs["restart"].value == pytest.approx(
        cats["startup"] / 3 + cats["checkpoint_restore"] / 2
    )
    assert inputs["checkpoint"].value == pytest.approx(2.0)  # every save blocked 2 s
    assert inputs["interval"].value == pytest.approx(102.0, abs=0.5)  # 100 steps + the save
    young = math.sqrt(2 * 2.0 * inputs["mtbf"].value)
    assert panel["result"]["young_s"] == pytest.approx(young)
    rows = {row["label"]: row for row in panel["result"]["rows"]}
    assert set(rows) == {"current interval", "Young optimum", "Daly optimum"}
    assert rows["Young optimum"]["ettr"] == pytest.approx(
        whatif.expected_ettr(
            mtbf_s=inputs["mtbf"].value,
            restart_s=inputs["restart"].value,
            interval_s=young,
            checkpoint_s=2.0,
            wait_s=inputs["wait"].value,
        )
    )
    html = r.content.decode()
    assert "Expected goodput (ETTR)" in html and "Cannot compute yet" not in html


def test_what_if_asks_for_what_cannot_be_measured_yet(viewer):
    ingest_job("steady-job", launches=1, steps_per_launch=300)  # no failure so far
    html = viewer.get("/jobs/steady-job/").content.decode()
    assert "Cannot compute yet" in html and "no failure measured" in html
    assert "Expected goodput (ETTR)" not in html

    r = viewer.get("/jobs/steady-job/?mtbf_h=10")
    inputs = r.context["whatif"]["result"]["inputs"]
    assert inputs["mtbf"].source == "entered" and inputs["mtbf"].value == 36_000
    assert "Expected goodput (ETTR)" in r.content.decode()

    r = viewer.get("/jobs/steady-job/?mtbf_h=-1&interval_min=abc")
    assert r.status_code == 200
    html = r.content.decode()
    assert "Cannot compute yet" in html
    assert html.count('class="error"') == 2


def test_the_rank_heatmap_shows_the_chosen_launch_where_its_straggler_stands_out(viewer, small):
    figs = charts(viewer.get("/jobs/small-job/").content.decode())
    assert "launch 3" in figs["chart-ranks"]["layout"]["title"]["text"]
    heat = figs["chart-ranks"]["data"][0]
    assert heat["y"][3] == "rank 3 · small-job-n0b"  # launch 3 ran on n0a and n0b
    assert len({v for row in heat["z"] for v in row}) == 1  # no straggler there

    figs = charts(viewer.get("/jobs/small-job/?attempt=1").content.decode())
    assert "launch 1" in figs["chart-ranks"]["layout"]["title"]["text"]
    z = figs["chart-ranks"]["data"][0]["z"]
    means = [sum(row) / len(row) for row in z]
    assert means.index(max(means)) == 3 and max(means) > 1.4 * min(means)

    figs = charts(viewer.get("/jobs/small-job/?attempt=99").content.decode())
    assert "launch 3" in figs["chart-ranks"]["layout"]["title"]["text"]


def test_a_job_with_no_events_yet_has_an_empty_page(viewer):
    TrainingJobFactory(key="new-job", cluster=cluster_get_or_create(name="east"))
    r = viewer.get("/jobs/new-job/")
    assert r.status_code == 200
    figs = charts(r.content.decode())
    assert "chart-ranks" not in figs
    assert trace(figs["chart-progress"], "step reached")["x"] == []


def test_the_job_list_is_paginated_and_its_queries_do_not_grow_with_jobs(
    client, personas, django_assert_max_num_queries
):
    client.force_login(personas["viewer"].user)
    cluster = cluster_get_or_create(name="east")

    def make(n):
        TrainingJob.objects.bulk_create(
            [TrainingJob(key=f"list-{n}-{k}", cluster=cluster) for k in range(n)]
        )
        for job in TrainingJob.objects.filter(key__startswith=f"list-{n}-"):
            ledger_snapshot_ensure(job=job)  # the snapshot the refresh task keeps

    make(3)
    with CaptureQueriesContext(client_connection()) as few:
        r = client.get("/jobs/")
    assert "Showing 1\u20133 of 3" in r.content.decode()
    make(120)
    with django_assert_max_num_queries(len(few)):
        r = client.get("/jobs/")
    html = r.content.decode()
    assert "Showing 1\u2013100 of 123" in html and "?page=2" in html
    assert "Showing 101\u2013123 of 123" in client.get("/jobs/?page=2").content.decode()


def test_a_recent_ledger_is_shown_while_its_refresh_is_on_its_way(viewer):
    from datetime import timedelta

    from jobs.models import LedgerSnapshot

    cluster = cluster_get_or_create(name="east")

    def send(raw):
        events, errors = validate_events(raw, 5000)
        assert not errors
        events_ingest(cluster=cluster, events=events)

    raw = job_events("running-job", launches=1, steps_per_launch=200)
    send([e for e in raw if e["kind"] not in ("attempt_ended", "job_finished")])  # running
    job = TrainingJob.objects.get(key="running-job")
    ledger_snapshot_ensure(job=job)  # the snapshot, current
    snapshot = LedgerSnapshot.objects.get(job=job)
    later = {"id": "late", "job": "running-job", "kind": "heartbeat", "node": "running-job-n1a"}
    send([{**later, "ts": raw[-1]["ts"] + 600, "data": {}}])  # the job's clock moves on
    assert snapshot.revision < TrainingJob.objects.get(pk=job.pk).revision  # no refresh ran

    r = viewer.get("/jobs/running-job/")
    assert r.context["figures"]["elapsed_s"] == snapshot.figures["elapsed_s"]  # as cached

    LedgerSnapshot.objects.filter(job=job).update(
        computed_at=snapshot.computed_at - timedelta(minutes=5)  # and none came since
    )
    r = viewer.get("/jobs/running-job/")
    assert r.context["figures"]["elapsed_s"] > snapshot.figures["elapsed_s"] + 599  # recomputed
    current = TrainingJob.objects.get(pk=job.pk).revision
    assert LedgerSnapshot.objects.get(job=job).revision == current


def test_gpu_hours_in_titles_keep_three_significant_digits():
    from console.charts import gpu_hours

    assert [gpu_hours(v) for v in (0.04123, 1.634, 12.27, 12270.4, 0.0)] == [
        "0.0412",
        "1.63",
        "12.3",
        "12,270",
        "0",
    ]
