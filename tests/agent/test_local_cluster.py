"""The local cluster: real torch ranks (gloo on loopback) under a supervisor; relaunches
from checkpoints on a spare, on fewer ranks and from a named step; injected faults.

One job ("base", 2 ranks, 12 steps, a checkpoint every 4) is trained once; the
relaunch tests each work on a copy of it, so they do not depend on each other.
Events are captured with the cluster's FileSink."""

import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from agent.checkpoints import checkpoint_steps
from agent.cluster import ClusterError, LocalCluster
from agent.sinks import read_events

pytestmark = pytest.mark.engine_free

TRAIN = {
    "global_batch": 8,
    "micro_batch": 2,
    "window": 4,
    "heartbeat_s": 0.3,
    "collective_timeout_s": 30,
}
TOKENS = 8 * 32  # global batch x sequence length


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster")
    c = LocalCluster.create(
        root,
        nodes={"n1": 1, "n2": 1, "n3": 1, "n4": 1},
        sink={"events": root / "events.jsonl"},
        heartbeat_s=0.3,
    )
    c.start_node_agents()
    yield c
    c.shutdown()


def events(cluster, job, kind=None, attempt=None):
    return [
        e
        for e in read_events(cluster.sink_spec["events"], kind=kind, job=job)
        if attempt is None or e.get("attempt") == attempt
    ]


def logs(cluster, job) -> str:
    adir = cluster.attempt_dir(job, cluster.current_attempt(job))
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(adir.glob("*.log")))


def steps_of(cluster, job, attempt=None):
    return {e["data"]["step"]: e["data"] for e in events(cluster, job, "step", attempt)}


def wait_for_step(cluster, job, step, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while not any(s >= step for s in steps_of(cluster, job)):
        st = cluster.status(job)
        assert st["state"] == "running", logs(cluster, job)
        assert time.monotonic() < deadline, logs(cluster, job)
        time.sleep(0.05)


def finished(cluster, job, state="completed", timeout_s=60):
    st = cluster.wait(job, timeout_s)
    assert st["state"] == state, logs(cluster, job)
    return st


def gone(pid) -> bool:
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture(scope="module")
def base(cluster):
    cluster.launch("base", nodes=["n1", "n2"], steps=12, ckpt_every=4, **TRAIN)
    return finished(cluster, "base")


def fork_job(cluster, src, dst):
    """A copy of a finished job (its launch records and checkpoints) to relaunch."""
    shutil.copytree(cluster.job_dir(src), cluster.job_dir(dst))


def test_a_launch_reports_its_life_steps_windows_checkpoints_and_heartbeats(cluster, base):
    assert [(r["node"], r["returncode"]) for r in base["ranks"]] == [("n1", 0), ("n2", 0)]
    assert all(gone(r["pid"]) for r in base["ranks"])
    kinds = [e["kind"] for e in events(cluster, "base") if e["kind"] != "heartbeat"]
    assert kinds[:2] == ["attempt_started", "ready"]
    assert kinds[-1] == "attempt_ended"
    assert "checkpoint_load_started" not in kinds  # nothing to resume from

    (started,) = events(cluster, "base", "attempt_started")
    assert started["attempt"] == 1 and started["rank"] == 0
    assert started["data"] == {"world_size": 2, "gpus_per_node": 1, "nodes": ["n1", "n2"]}
    assert started["ts"] == pytest.approx(cluster.plan("base")["launched_at"])

    steps = steps_of(cluster, "base")
    assert sorted(steps) == list(range(1, 13))
    assert {e["rank"] for e in events(cluster, "base", "step")} == {0}
    assert all(s["tokens"] == TOKENS and s["step_time_s"] > 0 for s in steps.values())
    assert all(math.isfinite(s["loss"]) and math.isfinite(s["grad_norm"]) for s in steps.values())
    assert steps[12]["loss"] < steps[1]["loss"]

    saved = events(cluster, "base", "checkpoint_saved")
    assert [e["data"]["step"] for e in saved] == [4, 8, 12]
    assert checkpoint_steps(cluster.checkpoint_dir("base")) == [4, 8, 12]
    save_started = {
        e["data"]["step"]: e["ts"] for e in events(cluster, "base", "checkpoint_save_started")
    }
    for e in saved:
        d = e["data"]
        assert d["bytes"] > 100_000 and d["tier"] == "durable"
        assert 0 <= d["blocking_s"] <= e["ts"] - save_started[d["step"]]
        assert d["uri"].startswith("file://") and d["uri"].endswith(f"step-{d['step']:08d}")

    windows = events(cluster, "base", "rank_window")
    placed = [
        (e["rank"], e["node"], e["data"]["first_step"], e["data"]["last_step"]) for e in windows
    ]
    assert sorted(placed) == [
        (0, "n1", 1, 4), (0, "n1", 5, 8), (0, "n1", 9, 12),
        (1, "n2", 1, 4), (1, "n2", 5, 8), (1, "n2", 9, 12),
    ]  # fmt: skip
    for e in windows:
        assert 0 < e["data"]["compute_s"] < e["data"]["step_s"]

    (ended,) = events(cluster, "base", "attempt_ended")
    assert ended["data"] == {"reason": "completed", "exit_code": 0}

    beats = events(cluster, "base", "heartbeat")
    assert {(e["node"], e.get("rank")) for e in beats} == {
        ("n1", None), ("n2", None),  # the node agents
        ("n1", 0), ("n2", 1),  # the ranks
    }  # fmt: skip


def test_replace_node_relaunches_on_a_spare_from_the_latest_checkpoint(cluster, base):
    fork_job(cluster, "base", "spare")
    st = cluster.replace_node("spare", "n2", steps=14)
    assert st["attempt"] == 2 and st["nodes"] == ["n1", "n3"]
    finished(cluster, "spare")

    (started,) = events(cluster, "spare", "attempt_started", attempt=2)
    assert started["data"]["nodes"] == ["n1", "n3"]
    lifecycle = [
        (e["kind"], e["data"].get("step"))
        for e in events(cluster, "spare", attempt=2)
        if e["kind"] in ("ready", "checkpoint_load_started", "checkpoint_loaded", "step")
    ]
    assert lifecycle == [
        ("ready", None),
        ("checkpoint_load_started", 12),
        ("checkpoint_loaded", 12),
        ("step", 13),
        ("step", 14),
    ]


def test_rollback_to_a_named_step_reruns_from_there_and_retires_newer_checkpoints(cluster, base):
    fork_job(cluster, "base", "rollback")
    cluster.relaunch("rollback", resume_step=4, steps=6)
    finished(cluster, "rollback")

    (loaded,) = events(cluster, "rollback", "checkpoint_loaded", attempt=2)
    assert loaded["data"] == {"step": 4}
    rerun, first_run = steps_of(cluster, "rollback", attempt=2), steps_of(cluster, "base")
    assert sorted(rerun) == [5, 6]
    for step in (5, 6):  # the same state and data give the same loss
        assert rerun[step]["loss"] == pytest.approx(first_run[step]["loss"], rel=1e-4)
    # 8 and 12 belong to the abandoned timeline; 6 is the rerun's final save.
    assert checkpoint_steps(cluster.checkpoint_dir("rollback")) == [4, 6]


def test_a_rollback_to_a_step_with_no_checkpoint_fails_without_training(cluster, base):
    fork_job(cluster, "base", "missing")
    cluster.relaunch("missing", resume_step=6)
    st = finished(cluster, "missing", "failed")
    assert st["failure"]["returncode"] == 2  # agent.demo_train: bad options
    (fault,) = events(cluster, "missing", "fault", attempt=2)
    assert fault["data"]["type"] == "other"
    assert events(cluster, "missing", "step", attempt=2) == []
    assert checkpoint_steps(cluster.checkpoint_dir("missing")) == [4, 8, 12]


def test_scale_down_runs_on_fewer_ranks_with_the_same_global_batch(cluster, base):
    fork_job(cluster, "base", "smaller")
    st = cluster.scale_down("smaller", "n2", resume_step=8, steps=10)
    assert st["world_size"] == 1 and st["nodes"] == ["n1"]
    finished(cluster, "smaller")

    (started,) = events(cluster, "smaller", "attempt_started", attempt=2)
    assert started["data"]["world_size"] == 1
    assert "accumulation 4" in (cluster.attempt_dir("smaller", 2) / "rank-0.log").read_text()
    one_rank, two_ranks = steps_of(cluster, "smaller", attempt=2), steps_of(cluster, "base")
    assert sorted(one_rank) == [9, 10]
    for step in (9, 10):  # 1 rank x 4 micro-batches trains on what 2 ranks x 2 did
        assert one_rank[step]["tokens"] == two_ranks[step]["tokens"] == TOKENS
        assert one_rank[step]["loss"] == pytest.approx(two_ranks[step]["loss"], rel=1e-3)
    assert {e["rank"] for e in events(cluster, "smaller", "rank_window", attempt=2)} == {0}


def test_a_launch_checks_the_global_batch_fits(cluster):
    with pytest.raises(ClusterError, match="global batch"):
        cluster.launch("odd", nodes=["n1", "n2", "n3"], steps=2, global_batch=8, micro_batch=2)


def test_a_killed_rank_fails_the_launch_and_the_rest_is_torn_down(cluster):
    cluster.launch("crash", nodes=["n3", "n4"], steps=100_000, ckpt_every=10_000, **TRAIN)
    wait_for_step(cluster, "crash", 3)
    assert cluster.report_xid("n4", 79) == ["crash"]
    cluster.kill_rank("crash", 1)
    st = finished(cluster, "crash", "failed", timeout_s=20)

    assert st["failure"]["rank"] == 1 and st["failure"]["node"] == "n4"
    assert st["failure"]["returncode"] == -9
    assert [r["state"] for r in st["ranks"]] == ["exited", "exited"]
    assert st["ranks"][0]["returncode"] != 0
    assert all(gone(r["pid"]) for r in st["ranks"])
    faults = [
        (e["data"]["type"], e.get("node"), e.get("rank"), e.get("attempt"))
        for e in events(cluster, "crash", "fault")
    ]
    assert faults[0] == ("gpu_xid", "n4", None, None)  # as a node agent: no attempt, no rank
    assert events(cluster, "crash", "fault")[0]["data"]["xid"] == 79
    assert ("crash", "n4", 1, 1) in faults  # from the supervisor
    # The peer may notice the dead connection first; it reports a symptom, not a crash.
    assert set(faults[1:]) <= {("crash", "n4", 1, 1), ("nccl_timeout", "n3", 0, 1)}
    (ended,) = events(cluster, "crash", "attempt_ended")
    assert ended["data"] == {"reason": "failed", "exit_code": -9}


def test_a_hung_rank_stops_the_steps_and_its_peer_times_out(cluster):
    train = {**TRAIN, "collective_timeout_s": 5}
    cluster.launch("hang", nodes=["n3", "n4"], steps=100_000, ckpt_every=10_000, **train)
    wait_for_step(cluster, "hang", 3)
    with pytest.raises(ClusterError, match="still running"):
        cluster.launch("hang", nodes=["n1", "n2"], steps=10)

    # The whole node hangs: its rank freezes and it sends no more heartbeats.
    cluster.stop_heartbeats("n4")
    cluster.hang_rank("hang", 1)
    t = time.time()
    time.sleep(0.4)
    before = len(steps_of(cluster, "hang"))
    time.sleep(1.5)
    assert len(steps_of(cluster, "hang")) == before
    assert [r["state"] for r in cluster.status("hang")["ranks"]] == ["running", "stopped"]
    recent = {e["node"] for e in events(cluster, "hang", "heartbeat") if e["ts"] > t + 0.4}
    assert recent == {"n3"}

    cluster.resume_rank("hang", 1)
    cluster.start_heartbeats("n4")
    wait_for_step(cluster, "hang", before + 5, timeout_s=10)

    cluster.hang_rank("hang", 1)  # for good, this time: rank 0 gives up after 5 s
    st = finished(cluster, "hang", "failed", timeout_s=30)
    assert st["failure"]["rank"] == 0 and st["failure"]["returncode"] == 3  # a lost peer
    assert all(gone(r["pid"]) for r in st["ranks"])
    faults = events(cluster, "hang", "fault")
    assert [(e["data"]["type"], e["rank"]) for e in faults] == [("nccl_timeout", 0)]
    (ended,) = events(cluster, "hang", "attempt_ended")
    assert ended["data"] == {"reason": "failed", "exit_code": 3}


def test_a_corrupted_loss_is_nan_from_the_given_step(cluster):
    cluster.corrupt_loss("nan-loss", "nan", from_step=6)
    cluster.launch("nan-loss", nodes=["n4"], steps=8, ckpt_every=100, **TRAIN)
    finished(cluster, "nan-loss")
    losses = [s["loss"] for _, s in sorted(steps_of(cluster, "nan-loss").items())]
    assert all(isinstance(v, float) for v in losses[:5])
    assert losses[5:] == ["NaN", "NaN", "NaN"]  # and it stays NaN: the weights are NaN now


def test_stop_ends_a_launch_as_killed(cluster):
    cluster.launch("stopped", nodes=["n1", "n2"], steps=100_000, ckpt_every=10_000, **TRAIN)
    st = cluster.stop("stopped", by="operator")
    assert st["state"] == "killed"
    assert all(gone(r["pid"]) for r in st["ranks"])
    (ended,) = events(cluster, "stopped", "attempt_ended")
    assert ended["data"] == {"reason": "killed", "requested_by": "operator"}  # not a fault
    assert "fault" not in {e["kind"] for e in events(cluster, "stopped")}


def test_stop_signals_only_a_supervisor_it_can_name(cluster):
    """A launch whose supervisor has not recorded itself yet is stopped through its
    stop.json: no pid is signalled (os.kill(0) would hit the caller's own group, a
    Celery worker running the local driver)."""
    cluster.launch("early", nodes=["n3", "n4"], steps=100_000, ckpt_every=10_000, **TRAIN)
    adir = cluster.attempt_dir("early", cluster.current_attempt("early"))
    (adir / "procs.json").unlink()  # as when the supervisor is still starting
    assert cluster.status("early")["state"] == "starting"
    code = (
        "import sys; from agent.cluster import LocalCluster;"
        " print(LocalCluster(sys.argv[1]).stop('early', timeout_s=30)['state'])"
    )
    stopper = subprocess.run(
        [sys.executable, "-c", code, str(cluster.root)],
        start_new_session=True,  # what it signals by mistake stays in its own group
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert stopper.returncode == 0, stopper.stderr[-2000:]
    assert stopper.stdout.strip() == "killed"
    assert all(gone(r["pid"]) for r in cluster.status("early")["ranks"])


def test_every_event_emitted_is_valid_wire_format_v1(cluster, base):
    """Everything the cluster's processes wrote (the jobs of the tests above that ran)
    passes the console's own validation of an ingest body."""
    from jobs.wire import validate_events

    emitted = read_events(cluster.sink_spec["events"])
    assert len(emitted) > 100
    for i in range(0, len(emitted), 1000):
        chunk = emitted[i : i + 1000]
        valid, errors = validate_events(chunk, max_events=1000)
        assert errors == [] and len(valid) == len(chunk)
    kinds = {e["kind"] for e in emitted}
    assert {"attempt_started", "ready", "step", "rank_window", "heartbeat"} <= kinds
    assert len({(e["job"], e["id"]) for e in emitted}) == len(emitted)  # ids are unique


def test_ranks_fill_multi_slot_nodes_in_order(tmp_path):
    c = LocalCluster.create(
        tmp_path, nodes={"a": 2, "b": 2}, sink={"events": tmp_path / "e.jsonl"}, heartbeat_s=1
    )
    try:
        c.launch("multi", nodes=["a", "b"], steps=2, **TRAIN)
        finished(c, "multi")
        placed = [(r["rank"], r["node"], r["local_rank"]) for r in c.plan("multi")["ranks"]]
        assert placed == [(0, "a", 0), (1, "a", 1), (2, "b", 0), (3, "b", 1)]
    finally:
        c.shutdown()
