"""The whole loop on real parts: torch ranks of the local cluster report through the
reporter to the console (a live server on PostgreSQL), a real Celery worker detects,
and relaunching through the local cluster (the call the recovery driver makes)
resumes the job from its last durable checkpoint.

Each test runs its own small cluster of 1-slot nodes under tmp_path."""

import time

import pytest
from django.db.models import Max, Min

pytest.importorskip("torch")

from incidents.models import DetectorSetting, Incident
from jobs.models import Cluster, Event, StepRecord, TrainingJob
from jobs.selectors import job_goodput
from tests.live import TRAIN, make_cluster, stored_step, until
from tests.processes import Server, celery_worker

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_killed_rank_is_an_incident_and_a_relaunch_on_a_spare_recovers(live_cluster):
    cluster = live_cluster
    with celery_worker() as worker:
        cluster.launch("e2e-crash", nodes=["n1", "n2"], steps=300, **TRAIN)
        until(lambda: stored_step("e2e-crash") >= 60, "step 60", cluster=cluster, job="e2e-crash")
        cluster.kill_rank("e2e-crash", 1)  # rank 1 runs on n2
        killed_at = time.time()
        incident = until(
            lambda: Incident.objects.filter(job__key="e2e-crash", nodes__name="n2").first(),
            "an incident naming n2",
            timeout_s=30,
        )
        detected_s = time.time() - killed_at
        assert incident.fault_type == "crash" and incident.attempt == 1
        assert cluster.wait("e2e-crash", 30)["state"] == "failed"
        saved = cluster.latest_checkpoint("e2e-crash")
        cluster.replace_node("e2e-crash", "n2", spare="n3")
        assert cluster.wait("e2e-crash", 120)["state"] == "completed"
        job = TrainingJob.objects.get(key="e2e-crash")
        until(lambda: stored_step("e2e-crash", 2) == 300, "launch 2 to report step 300")

        # It resumed from its last durable checkpoint and went on from the step after.
        loaded = Event.objects.get(job=job, kind="checkpoint_loaded", attempt=2)
        assert loaded.data["step"] == saved
        first = StepRecord.objects.filter(job=job, attempt=2).aggregate(m=Min("step"))["m"]
        assert first == saved + 1
        assert list(cluster.plan("e2e-crash")["nodes"]) == ["n1", "n3"]

        # The steps launch 1 made past that checkpoint were re-run: wasted progress.
        rerun = StepRecord.objects.filter(job=job, attempt=1, step__gt=saved).count()
        assert rerun > 0
        job.refresh_from_db()
        ledger = job_goodput(job=job)
        assert ledger["categories"]["wasted_progress"] > 0
        assert ledger["categories"]["downtime"] > 0

        # The incident's times and cost follow the ledger's refresh in the worker.
        def recovered():
            i = Incident.objects.get(pk=incident.pk)
            return i if i.recovered_at is not None else None

        incident = until(recovered, "the incident's recovery")
        second = StepRecord.objects.filter(job=job, attempt=2)
        assert incident.resumed_at.timestamp() == pytest.approx(
            second.aggregate(t=Min("ts"))["t"], abs=1e-3
        )
        assert incident.time_to_resume_s > 0
        assert incident.time_to_recover_s >= incident.time_to_resume_s
        assert incident.lost_breakdown["wasted_progress"] > 0
        assert incident.state == Incident.State.RECOVERED
    assert "incidents.open_reported" in worker.output
    assert detected_s < 10


def test_a_slowed_rank_is_a_straggler_named_by_its_node(live_cluster):
    cluster = live_cluster
    # Steps of a few milliseconds jitter with the machine's load: a rank the scheduler
    # holds back looks slow for a window or three. A longer streak than the default
    # keeps this test about the rank slowed on purpose.
    local = Cluster.objects.get(name="local")
    DetectorSetting.objects.create(cluster=local, name="straggler.windows", value=8)
    with celery_worker():
        cluster.slow_rank("e2e-slow", 2, 4.0)  # rank 2 runs on n3
        cluster.launch("e2e-slow", nodes=["n1", "n2", "n3", "n4"], steps=400, **TRAIN)
        incident = until(
            lambda: Incident.objects.filter(job__key="e2e-slow", fault_type="straggler").first(),
            "a straggler incident",
            cluster=cluster,
            job="e2e-slow",
        )
        cluster.stop("e2e-slow")
    assert [n.name for n in incident.nodes.all()] == ["n3"]
    assert incident.ranks == [2]
    assert incident.cause == Incident.Cause.STRAGGLER


def test_a_stopped_rank_is_a_hang(live_cluster):
    cluster = live_cluster
    # Steps take tens of milliseconds here; a 3 s floor keeps the test short. The
    # stopped rank's node falls silent too (its heartbeats came from that process): past
    # the dead-node timeout that would explain the hang (a host), whenever a loaded
    # machine delays the first pass that far; this test is about the hang.
    local = Cluster.objects.get(name="local")
    DetectorSetting.objects.create(cluster=local, name="hang.floor_s", value=3)
    DetectorSetting.objects.create(cluster=local, name="dead_node.timeout_s", value=600)
    # The rank is stopped near step 25, when a checkpoint save is due: a save in flight
    # in the gap adds its allowance (600 s) to the timeout, and the peer's collective
    # timeout (60 s) would then end the launch first, an NCCL timeout explaining it.
    DetectorSetting.objects.create(cluster=local, name="hang.save_allowance_s", value=0)
    with celery_worker():
        cluster.launch(
            "e2e-hang", nodes=["n1", "n2"], steps=5000, **{**TRAIN, "collective_timeout_s": 600}
        )
        until(lambda: stored_step("e2e-hang") >= 20, "step 20", cluster=cluster, job="e2e-hang")
        cluster.hang_rank("e2e-hang", 1)
        incident = until(
            lambda: Incident.objects.filter(job__key="e2e-hang", fault_type="hang").first(),
            "a hang incident",
            # The timeout is 5x the longest step interval seen: a loaded machine that
            # stalled one step for 10 s makes it 50 s.
            timeout_s=120,
            describe=lambda: list(
                Incident.objects.filter(job__key="e2e-hang").values_list("fault_type", "cause")
            ),
        )
        cluster.stop("e2e-hang")
    assert incident.cause == Incident.Cause.HANG
    assert incident.time_to_detect_s >= 3
    last_step = StepRecord.objects.filter(job__key="e2e-hang").aggregate(t=Max("ts"))["t"]
    assert incident.fault_at.timestamp() == pytest.approx(last_step, abs=1e-5)  # last progress


def test_the_console_going_away_mid_run_loses_no_lifecycle_event(tmp_path, quick_passes):
    """The console (gunicorn) stops while the job trains and comes back: the ranks'
    reporters keep what they could not send and deliver it, nothing twice."""
    with celery_worker():
        server = Server(tmp_path / "var")
        server.start()
        cluster = make_cluster(tmp_path, server.url, nodes=("n1", "n2"))
        try:
            cluster.launch("e2e-outage", nodes=["n1", "n2"], steps=400, **TRAIN)
            until(lambda: stored_step("e2e-outage") >= 30, "step 30")
            server.stop()
            time.sleep(4)  # the job trains on, unheard
            server.start()
            assert cluster.wait("e2e-outage", 120)["state"] == "completed"
            until(
                lambda: Event.objects.filter(job__key="e2e-outage", kind="attempt_ended").exists(),
                "the launch's end",
            )
        finally:
            cluster.shutdown()
            server.stop()
    job = TrainingJob.objects.get(key="e2e-outage")
    steps = StepRecord.objects.filter(job=job, attempt=1)
    assert steps.count() == 400 and set(steps.values_list("step", flat=True)) == set(range(1, 401))
    saved = Event.objects.filter(job=job, kind="checkpoint_saved").count()
    assert saved == 400 // TRAIN["ckpt_every"]
    for kind in ("attempt_started", "ready", "attempt_ended"):
        assert Event.objects.filter(job=job, kind=kind).count() == 1, kind
