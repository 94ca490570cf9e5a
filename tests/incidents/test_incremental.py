"""Incremental detection: a pass reads only what was stored since the last one, and
still finds what one pass over the whole history finds, whatever the order
events arrive in (late rows make it rebuild its state)."""

import random

import psycopg
import pytest
from django.db import transaction

from incidents import services
from incidents.detectors.engine import watch_job
from incidents.models import DetectorSetting, Incident
from incidents.settings import detector_settings
from jobs.models import TrainingJob
from tests.processes import database_url

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0
NODES = ["n0", "n1", "n2", "n3"]  # two ranks each


def trace(job):
    """Launch 1: a loss spike at step 150, n3 slow from step 101, n2's heartbeats stop
    at 250 s, steps stop after 300 s (a hang), the launch fails at 500 s.
    Launch 2 resumes from step 250 and completes."""
    n = iter(range(10**6))

    def ev(kind, ts, attempt=1, **fields):
        e = {"id": f"e{next(n)}", "job": job, "kind": kind, "ts": T0 + ts, **fields}
        if attempt is not None:
            e["attempt"] = attempt
        e.setdefault("data", {})
        return e

    out = []
    for attempt, t0, first, last in ((1, 0, 1, 300), (2, 520, 251, 400)):
        data = {"world_size": 8, "gpus_per_node": 2, "nodes": NODES}
        out.append(ev("attempt_started", t0, attempt, data=data))
        out.append(ev("ready", t0 + 5, attempt))
        if attempt == 2:
            out.append(ev("checkpoint_loaded", t0 + 9, attempt, data={"step": 250}))
        for step in range(first, last + 1):
            ts = t0 + 10 + (step - first)
            loss = 5.0 / (1 + 0.01 * step) * (3 if (attempt, step) == (1, 150) else 1)
            out.append(ev("step", ts, attempt, data={"step": step, "loss": loss}))
            if step % 50 == 0 and attempt == 1 and step < 300:
                out.append(ev("checkpoint_save_started", ts + 0.1, attempt, data={"step": step}))
                out.append(ev("checkpoint_saved", ts + 0.5, attempt, data={"step": step}))
            if (step - first + 1) % 10 == 0:
                for rank in range(8):
                    slowed = attempt == 1 and step > 100
                    c = 1.3 if slowed and rank in (6, 7) else 0.8
                    data = {
                        "first_step": step - 9,
                        "last_step": step,
                        "compute_s": c,
                        "step_s": 1.5 if slowed else 1.0,
                    }
                    node = NODES[rank // 2]
                    out.append(ev("rank_window", ts, attempt, rank=rank, node=node, data=data))
        stop = 500 if attempt == 1 else t0 + 10 + last - first
        for node in NODES:
            t = t0
            while t <= stop:
                if not (attempt == 1 and node == "n2" and t > 250):
                    out.append(ev("heartbeat", t, None, node=node))
                t += 5
        end = {"reason": "failed"} if attempt == 1 else {"reason": "completed"}
        out.append(ev("attempt_ended", stop, attempt, data=end))
    return sorted(out, key=lambda e: e["ts"])


def summary(key):
    return sorted(
        (
            i.detector,
            i.episode,
            i.fault_type,
            round(i.fault_at.timestamp(), 3),
            round(i.detected_at.timestamp(), 3),
            tuple(sorted(n.name for n in i.nodes.all())),
            tuple(i.ranks),
            round(i.lost_gpu_seconds, 3),
        )
        for i in Incident.objects.filter(job__key=key)
    )


def one_pass(ingest, key):
    assert ingest(trace(key)).status_code == 202
    job = TrainingJob.objects.get(key=key)
    services.incidents_detect(job=job)
    services.incidents_update_figures(job=job)
    return summary(key)


def watch(key):
    job = TrainingJob.objects.get(key=key)
    return watch_job(job, detector_settings(job))


def test_the_trace_has_one_of_each(ingest):
    found = {row[2] for row in one_pass(ingest, "whole")}
    assert found == {"loss_spike", "straggler", "dead_node", "hang"}


def test_in_order_batches_read_only_what_is_new(ingest):
    expected = one_pass(ingest, "whole")
    events = trace("live")
    rebuilt, total = [], 0
    for i in range(0, len(events), 97):
        batch = events[i : i + 97]
        assert ingest(batch).status_code == 202
        w = watch("live")
        rebuilt.append(w.rebuilt)
        stream = sum(e["kind"] in ("step", "rank_window") for e in batch)
        assert w.rows_read == stream  # only the batch's own steps and windows
        total += w.rows_read
        services.incidents_detect(job=TrainingJob.objects.get(key="live"))
    assert rebuilt[0] and not any(rebuilt[1:])
    services.incidents_update_figures(job=TrainingJob.objects.get(key="live"))
    assert summary("live") == [(r[0], *r[1:]) for r in expected]


@pytest.mark.parametrize("seed", [1, 2])
def test_shuffled_batches_rebuild_and_agree(ingest, seed):
    expected = one_pass(ingest, "whole")
    events = trace("late")
    rng = random.Random(seed)
    # Mostly in order, with some batches held back and sent late.
    batches = [events[i : i + 150] for i in range(0, len(events), 150)]
    late = rng.sample(range(len(batches)), 3)
    order = [b for k, b in enumerate(batches) if k not in late] + [batches[k] for k in late]
    rebuilds = 0
    for batch in order:
        assert ingest(batch).status_code == 202
        rebuilds += watch("late").rebuilt
        services.incidents_detect(job=TrainingJob.objects.get(key="late"))
    services.incidents_update_figures(job=TrainingJob.objects.get(key="late"))
    assert rebuilds >= 2  # the first pass, and a late batch at least
    assert summary("late") == expected


def test_heartbeats_of_two_ranks_out_of_step_do_not_rebuild(ingest):
    events = trace("beats")
    assert ingest(events[:400]).status_code == 202
    watch("beats")
    # Two ranks on n0 report every 2 s; rank 1's batches arrive one bucket late.
    n = iter(range(10**6))
    t_end = events[399]["ts"]
    for k in range(10):
        t = t_end + 10 * k
        batch = [
            {"id": f"hb{next(n)}", "job": "beats", "kind": "heartbeat", "ts": t + dt, "node": "n0"}
            for dt in (0, 2, 4, 6, 8)
        ]
        batch += [
            {"id": f"hb{next(n)}", "job": "beats", "kind": "heartbeat", "ts": t - 10 + dt}
            | {"node": "n0", "rank": 1}
            for dt in (1, 3, 5, 7, 9)
        ]
        assert ingest(batch).status_code == 202
        assert not watch("beats").rebuilt


def test_a_changed_setting_rebuilds(ingest):
    assert ingest(trace("cfg")).status_code == 202
    assert watch("cfg").rebuilt
    assert not watch("cfg").rebuilt
    job = TrainingJob.objects.get(key="cfg")
    DetectorSetting.objects.create(job=job, name="straggler.windows", value=30)
    w = watch("cfg")
    assert w.rebuilt and w.stragglers == []  # 20 slow windows no longer make a streak


def test_a_late_heartbeat_rereads_its_node_not_the_job(ingest):
    expected = one_pass(ingest, "whole")
    events = trace("hb")
    # n1's heartbeats of 15 s (under the dead-node timeout: no silence while they are
    # away) arrive after everything up to 200 s: two buckets behind the ones read.
    held = [
        e
        for e in events
        if e["kind"] == "heartbeat" and e["node"] == "n1" and T0 + 100 < e["ts"] <= T0 + 115
    ]
    assert {int(e["ts"] // 10) for e in held} == {int(T0 // 10) + 10, int(T0 // 10) + 11}
    rest = [e for e in events if e not in held]
    head = [e for e in rest if e["ts"] <= T0 + 200]
    batches = [head[i : i + 97] for i in range(0, len(head), 97)]
    late = len(batches)
    batches.append(held)
    tail = [e for e in rest if e["ts"] > T0 + 200]
    batches += [tail[i : i + 97] for i in range(0, len(tail), 97)]
    reread = []
    for k, batch in enumerate(batches):
        assert ingest(batch).status_code == 202
        w = watch("hb")
        assert w.rebuilt == (k == 0)
        reread.append(w.nodes_reread)
        services.incidents_detect(job=TrainingJob.objects.get(key="hb"))
    assert reread[late] == ["n1"]  # that node alone, in place of a rebuild
    assert sum(map(len, reread)) == 1
    services.incidents_update_figures(job=TrainingJob.objects.get(key="hb"))
    assert summary("hb") == expected


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_pass_holds_the_jobs_lock_only_to_read_its_bounds(ingest):
    """Ingest locks the job's row; a pass takes that lock only while it reads the tables'
    highest ids, not for the rest of the transaction it runs in (the task's pass runs in
    one): at 16,384 ranks a pass takes most of a second, and every batch of the job
    waited it out (bench/fleet_load.py's POST p95 of 0.3-0.6 s)."""
    assert ingest(trace("inc-lock")).status_code == 202
    job = TrainingJob.objects.get(key="inc-lock")
    with transaction.atomic():  # as incidents_detect_pass runs it
        watch_job(job, detector_settings(job))
        with psycopg.connect(database_url(), autocommit=True) as ingest_connection:
            locked = ingest_connection.execute(
                "SELECT id FROM jobs_trainingjob WHERE id = %s FOR UPDATE NOWAIT", [job.id]
            ).fetchall()
    assert locked == [(job.id,)]


def test_windows_split_across_passes_are_kept_by_id_not_as_rows(ingest):
    """Each window's ranks arrive in two halves, a pass after each: the state keeps the
    incomplete half as the lowest id of its rows (read back by the next pass), and the
    straggler is found as from whole windows."""
    from incidents.models import DetectorState

    expected = one_pass(ingest, "whole")
    events = trace("split")
    windows = [e for e in events if e["kind"] == "rank_window"]
    rest = [e for e in events if e["kind"] != "rank_window"]
    assert ingest(rest).status_code == 202
    held = []
    for i in range(0, len(windows), 8):
        first, second = windows[i : i + 4], windows[i + 4 : i + 8]
        for half in (first, second):
            assert ingest(half).status_code == 202
            services.incidents_detect(job=TrainingJob.objects.get(key="split"))
            state = DetectorState.objects.get(job__key="split").data
            held.append({n: ls["pending_from"] for n, ls in state["launches"].items()})
            assert all("pending" not in ls for ls in state["launches"].values())
    assert any(v is not None for h in held for v in h.values())  # halves were held
    services.incidents_update_figures(job=TrainingJob.objects.get(key="split"))
    assert summary("split") == expected
