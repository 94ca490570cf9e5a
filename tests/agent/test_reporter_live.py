"""The reporter against the real console (pytest-django's live server), and through an outage."""

import logging
import time
from collections import Counter
from urllib.parse import urlsplit

import pytest

from agent.reporter import Reporter
from common.vocabulary import NEVER_SHED_KINDS
from console.services import token_issue
from jobs.models import Attempt, Checkpoint, Event, HeartbeatBucket, StepRecord, TrainingJob
from tests.agent.fakes import TcpProxy, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

JOB = "agent-live"


@pytest.fixture
def token(transactional_db):
    _, raw = token_issue(scope="ingest", cluster_name="east")
    return raw


@pytest.fixture
def reporter(token, tmp_path):
    made = []

    def make(url, **kw):
        opts = dict(
            token=token,
            job=JOB,
            node="n0",
            rank=0,
            attempt=1,
            flush_interval_s=0.05,
            backoff_base_s=0.01,
            backoff_cap_s=0.1,
            timeout_s=3.0,
            spill_path=tmp_path / "spill.jsonl",
            handle_sigterm=False,
        )
        opts.update(kw)
        r = Reporter(url, **opts)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close(timeout_s=0.5)


class Trace:
    """Emits a small job's events and remembers what it emitted."""

    def __init__(self, reporter):
        self.r = reporter
        self.ids: dict[str, str] = {}  # id -> kind
        self.t = time.time() - 3600

    def emit(self, kind, data=None, **kw):
        self.t += 0.5
        event_id = self.r.emit(kind, data, ts=self.t, **kw)
        self.ids[event_id] = kind
        return event_id

    def start(self):
        self.emit("attempt_started", {"world_size": 2, "gpus_per_node": 1, "nodes": ["n0", "n1"]})
        self.emit("ready")

    def step(self, s):
        self.emit("step", {"step": s, "loss": 3.0 - s / 100, "step_time_s": 0.5, "tokens": 1024})

    def window(self, s):
        data = {"first_step": s, "last_step": s, "compute_s": 0.4, "step_s": 0.5}
        self.emit("rank_window", data, rank=1, node="n1")

    def checkpoint(self, s):
        self.emit("checkpoint_save_started", {"step": s})
        self.emit(
            "checkpoint_saved", {"step": s, "blocking_s": 0.2, "bytes": 10, "uri": f"mem://{s}"}
        )

    def lifecycle_ids(self):
        return {i for i, kind in self.ids.items() if kind in NEVER_SHED_KINDS}


def trace_window(s):
    return {"first_step": s, "last_step": s, "compute_s": 0.4, "step_s": 0.5}


def stored():
    return dict(Event.objects.filter(job__key=JOB).values_list("client_id", "kind"))


def test_a_job_trace_lands_in_the_console(live_server, reporter):
    r = reporter(live_server.url)
    trace = Trace(r)
    trace.start()
    for s in range(1, 21):
        trace.step(s)
        if s % 5 == 0:
            trace.emit("heartbeat")
            trace.emit("heartbeat", node="n1")
            trace.window(s)
        if s == 10:
            trace.checkpoint(10)
    trace.emit("attempt_ended", {"reason": "completed", "exit_code": 0})
    trace.emit("job_finished")
    assert r.close(timeout_s=10) is True
    assert r.stats["sent"] == len(trace.ids) and r.stats["failures"] == 0

    # Every event stored but the plain heartbeats, which went into their nodes' buckets.
    assert stored() == {i: kind for i, kind in trace.ids.items() if kind != "heartbeat"}
    beats = HeartbeatBucket.objects.filter(job__key=JOB)
    assert set(beats.values_list("node", flat=True)) == {"n0", "n1"}
    steps = StepRecord.objects.filter(job__key=JOB).order_by("step")
    assert [(x.step, x.loss) for x in steps] == [(s, 3.0 - s / 100) for s in range(1, 21)]
    attempt = Attempt.objects.get(job__key=JOB, number=1)
    assert attempt.world_size == 2 and attempt.end_reason == "completed"
    assert Checkpoint.objects.get(job__key=JOB).step == 10
    job = TrainingJob.objects.get(key=JOB)
    assert job.last_step == 20 and job.events_count == len(stored())


def test_a_resend_is_a_duplicate_and_a_bad_event_is_dropped_alone(live_server, reporter, caplog):
    r = reporter(live_server.url)
    trace = Trace(r)
    trace.start()
    trace.step(1)
    assert r.flush(10)
    # The same ids again (a restarted process resending): stored once.
    again = reporter(live_server.url)
    for event_id, kind in trace.ids.items():
        data = {"world_size": 2} if kind == "attempt_started" else {"step": 1}
        again.emit(kind, None if kind == "ready" else data, event_id=event_id)
    # A step without its step number: the console names it, the others go in.
    with caplog.at_level(logging.ERROR, logger="rebound.agent"):
        bad = again.emit("step", {"loss": 1.0})
        good = again.emit("step", {"step": 2})
        assert again.flush(10)
    assert again.stats["duplicates"] == 3 and again.stats["rejected"] == 1
    assert set(stored()) == {*trace.ids, good}
    assert bad in caplog.text and "data.step" in caplog.text


def test_a_new_launch_of_a_finished_job_is_dropped_not_retried_forever(
    live_server, reporter, caplog
):
    """The console refuses (409) events that would rewrite a finished job's history; a
    reporter that kept them would be stuck behind them forever. It drops those, says so,
    and goes on delivering what the console takes."""
    r = reporter(live_server.url)
    trace = Trace(r)
    trace.start()
    trace.step(1)
    trace.emit("attempt_ended", {"reason": "completed", "exit_code": 0})
    trace.emit("job_finished")
    assert r.flush(10)
    finished = set(stored())

    again = reporter(live_server.url, attempt=2)
    with caplog.at_level(logging.ERROR, logger="rebound.agent"):
        restart = Trace(again)
        restart.t = trace.t + 60  # a launch after the finish: a new launch of a finished job
        restart.start()
        restart.step(1)
        assert again.flush(10), "the refused events must not block the queue"
        # The reporter keeps working: a late event of the finished launch still goes in.
        late = again.emit("rank_window", trace_window(1), ts=trace.t - 1, attempt=1, rank=1)
        assert again.flush(10)
    assert set(stored()) == finished | {late}
    assert again.stats["rejected"] == len(restart.ids)
    assert "409" in caplog.text and "history_conflict" in caplog.text


def test_nothing_of_the_lifecycle_is_lost_or_doubled_through_an_outage(live_server, reporter):
    host = urlsplit(live_server.url)
    proxy = TcpProxy((host.hostname, host.port)).start()
    try:
        r = reporter(proxy.url, max_queue=30, batch_size=10)
        trace = Trace(r)
        trace.start()
        for s in range(1, 6):
            trace.step(s)
        assert r.flush(10)

        proxy.stop()
        for s in range(6, 91):
            trace.step(s)
            trace.emit("heartbeat")
            if s % 2 == 0:
                trace.window(s)
            if s % 20 == 0:
                trace.checkpoint(s)
        trace.emit("fault", {"type": "network", "message": "the console went away"})
        trace.emit("attempt_ended", {"reason": "completed"})
        stats = r.stats
        assert stats["shed"] > 0 and stats["spilled"] > 0
        assert not r.flush(0.2)

        proxy.start()
        assert r.flush(30)
        assert wait_for(lambda: r.stats["queued"] == 0)
    finally:
        proxy.stop()

    got = stored()
    assert trace.lifecycle_ids() <= set(got)  # every lifecycle event is there
    assert set(got) <= set(trace.ids)
    # Only what was shed is missing: every other event reached the console (a plain
    # heartbeat is accepted into its bucket, not stored), and what is not stored of the
    # kinds stored is windows, shed after the heartbeats.
    assert r.stats["sent"] == len(trace.ids) - r.stats["shed"]
    kept = {i for i, kind in trace.ids.items() if kind != "heartbeat"}
    assert {trace.ids[i] for i in kept - set(got)} <= {"rank_window"}
    steps = list(StepRecord.objects.filter(job__key=JOB).values_list("step", flat=True))
    assert sorted(steps) == list(range(1, 91))  # each step once
    kinds = Counter(got.values())
    assert kinds["checkpoint_saved"] == 4 and kinds["attempt_ended"] == 1
    assert TrainingJob.objects.get(key=JOB).events_count == len(got)
