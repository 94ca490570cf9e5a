"""agent.init in one process (a world of 1, no torch.distributed): the lifecycle it reports
by itself against the live console, stable ids, and the ways it does not report: no
console, a console away, a launch the console refuses."""

import time

import pytest

import agent
from agent.launch_env import EXIT_REFUSED, read_state
from console.services import token_issue
from jobs.models import Attempt, Event, HeartbeatBucket, LaunchReservation
from tests.agent.test_launch_env import Console

JOB = "auto-one"


def _environ(url, token, tmp_path, **more):
    return {
        "REBOUND_URL": url,
        "REBOUND_TOKEN": token,
        "REBOUND_JOB": JOB,
        "REBOUND_NODE": "box1",
        "REBOUND_HEARTBEAT_S": "0.1",
        "REBOUND_LAUNCH_STATE": str(tmp_path / "state"),
        **more,
    }


FAST = {"flush_interval_s": 0.05, "handle_sigterm": False}


@pytest.mark.django_db(transaction=True)
def test_one_call_reports_the_launch_by_itself(live_server, tmp_path):
    _, token = token_issue(scope="ingest", cluster_name="east")
    environ = _environ(live_server.url, token, tmp_path)
    inst = agent.init(environ=environ, reporter_options={"spill_path": tmp_path / "s", **FAST})
    assert (inst.attempt, inst.launch.attempt, inst.launch.nodes) == (1, 1, ["box1"])
    assert read_state(str(tmp_path / "state"))["ready"] is False
    for step in range(1, 6):
        with inst.step(step) as s:
            time.sleep(0.01)
            s.report(loss=1.0 / step)
    assert read_state(str(tmp_path / "state"))["ready"] is True
    time.sleep(0.25)  # a heartbeat or two
    # A resend of the launch's start (a second emit with its stable id) is stored once.
    inst.attempt_started(world_size=1, nodes=["box1"], ts=time.time() - 60)
    inst.finish()
    inst.finish()  # idempotent

    events = Event.objects.filter(job__key=JOB)
    kinds = [e.kind for e in events.exclude(kind="heartbeat").order_by("ts", "id")]
    assert kinds[0] == "attempt_started" and kinds[1] == "ready"
    assert kinds.count("step") == 5
    assert kinds[-2:] == ["attempt_ended", "job_finished"]
    assert kinds.count("attempt_started") == 1
    start = events.get(kind="attempt_started")
    identity = LaunchReservation.objects.get(job__key=JOB).identity
    assert start.client_id.startswith("launch-1-") and start.client_id.endswith("-attempt_started")
    assert start.data["launch"] == identity
    assert (start.data["world_size"], start.data["gpus_per_node"], start.data["nodes"]) == (
        1,
        1,
        ["box1"],
    )
    # stamped at the process's start: before this test made the Instrument
    assert start.ts < events.get(kind="ready").ts
    assert HeartbeatBucket.objects.filter(job__key=JOB, node="box1").exists()  # heartbeats came
    launch = Attempt.objects.get(job__key=JOB, number=1)
    assert launch.end_reason == "completed"
    assert read_state(str(tmp_path / "state")) == {
        "job": JOB, "attempt": 1, "launch": identity, "ready": True, "ended": True,
        "reports": True,
    }  # fmt: skip


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("local_rank", "beats"), [("0", True), ("1", False)])
def test_a_nodes_heartbeats_come_from_its_local_rank_0_alone(
    live_server, tmp_path, local_rank, beats
):
    _, token = token_issue(scope="ingest", cluster_name="east")
    environ = _environ(live_server.url, token, tmp_path, LOCAL_RANK=local_rank)
    inst = agent.init(environ=environ, reporter_options={"spill_path": tmp_path / "s", **FAST})
    try:
        assert (inst.heartbeat is not None) is beats
        time.sleep(0.3)
    finally:
        inst.finish()
    assert HeartbeatBucket.objects.filter(job__key=JOB).exists() is beats


@pytest.mark.django_db(transaction=True)
def test_an_exception_out_of_the_block_is_a_crash_and_a_failed_launch(live_server, tmp_path):
    _, token = token_issue(scope="ingest", cluster_name="east")
    environ = _environ(live_server.url, token, tmp_path)
    options = {"spill_path": tmp_path / "s", **FAST}
    with pytest.raises(RuntimeError), agent.init(environ=environ, reporter_options=options) as inst:
        with inst.step(1):
            pass
        raise RuntimeError("the loss went away")
    events = Event.objects.filter(job__key=JOB)
    fault = events.get(kind="fault")
    assert fault.data == {"type": "crash", "message": "RuntimeError: the loss went away"}
    assert events.get(kind="attempt_ended").data == {"reason": "failed", "exit_code": 1}
    assert not events.filter(kind="job_finished").exists()


def test_without_a_console_the_job_trains_unreported(tmp_path, capsys):
    inst = agent.init(environ={"REBOUND_JOB": JOB})
    for step in range(1, 4):
        with inst.step(step) as s:
            s.report(loss=1.0)
    inst.finish()
    assert inst.launch is None and inst.attempt is None
    err = capsys.readouterr().err
    assert err.count("reporting is off") == 1
    assert "REBOUND_URL is not set" in err


def test_a_console_that_stays_away_leaves_the_job_training(tmp_path, capsys):
    environ = _environ("http://127.0.0.1:9", "tok", tmp_path, REBOUND_LAUNCH_RETRY_S="0.3")
    t0 = time.monotonic()
    inst = agent.init(environ=environ)
    assert time.monotonic() - t0 < 5
    with inst.step(1):
        pass
    inst.close()
    err = capsys.readouterr().err
    assert "reporting is off" in err and "no answer from http://127.0.0.1:9" in err


def test_a_refused_launch_exits_with_its_code_and_the_consoles_detail(tmp_path, capsys):
    detail = f"job {JOB} is in a crash loop (incident #7: 5 launches within 30 minutes); ..."
    console = Console([(409, {"error": "crash_loop", "detail": detail, "job": JOB, "incident": 7})])
    try:
        with pytest.raises(SystemExit) as exited:
            agent.init(environ=_environ(console.url, "tok", tmp_path))
    finally:
        console.close()
    assert exited.value.code == EXIT_REFUSED
    err = capsys.readouterr().err
    assert detail in err and "(crash_loop)" in err
    state = read_state(str(tmp_path / "state"))
    assert state["refused"] == {"code": "crash_loop", "detail": detail}
    assert (state["attempt"], state["ended"]) == (None, True)
