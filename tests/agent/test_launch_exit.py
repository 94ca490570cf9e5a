"""The launcher wrapper without torch: the exit -> reason mapping, `launch.json` as the
wrapper reads it, and the wrapper around small stdlib children (standing in for
torchrun's ranks) reporting to a fake console."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agent.launch import (
    EXIT_REFUSED,
    Watch,
    cgroup_events,
    event_id,
    exit_reason,
    first_node,
    guess_script,
    oom_kills,
    read_launch,
    split_exit,
    status_data,
)
from agent.launch_env import LaunchState, identity_digest
from tests.agent.fakes import TOKEN, FakeConsole, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("returncode", "told", "oom", "expected"),
    [
        (0, None, False, {"reason": "completed", "exit_code": 0}),
        (3, None, False, {"reason": "failed", "exit_code": 3}),
        (1, None, False, {"reason": "failed", "exit_code": 1}),
        (-9, None, False, {"reason": "failed", "exit_code": 137, "signal": "SIGKILL"}),
        (137, None, False, {"reason": "failed", "exit_code": 137, "signal": "SIGKILL"}),
        (-9, None, True, {"reason": "failed", "exit_code": 137, "signal": "SIGKILL", "oom": True}),
        (-11, None, False, {"reason": "failed", "exit_code": 139, "signal": "SIGSEGV"}),
        (
            -15,
            None,
            False,
            {
                "reason": "preempted",
                "exit_code": 143,
                "signal": "SIGTERM",
                "requested_by": "scheduler",
            },
        ),
        (
            143,
            None,
            False,
            {
                "reason": "preempted",
                "exit_code": 143,
                "signal": "SIGTERM",
                "requested_by": "scheduler",
            },
        ),
        # The wrapper told to stop: torchrun exits 1 after closing its workers.
        (
            1,
            signal.SIGTERM,
            False,
            {"reason": "preempted", "exit_code": 1, "requested_by": "scheduler"},
        ),
        (
            1,
            signal.SIGINT,
            False,
            {"reason": "killed", "exit_code": 1, "requested_by": "alice (SIGINT)"},
        ),
        (
            -2,
            signal.SIGINT,
            False,
            {
                "reason": "killed",
                "exit_code": 130,
                "signal": "SIGINT",
                "requested_by": "alice (SIGINT)",
            },
        ),
    ],
)
def test_an_exit_maps_to_its_reason(returncode, told, oom, expected):
    got = exit_reason(returncode, told=told, oom=oom, user="alice")
    message = got.pop("message", None)
    assert got == expected
    # A failure says what happened in words; a completion or a requested end needs none.
    assert (message is not None) == (expected["reason"] == "failed")
    if oom:
        assert "OOM" in message


def test_exit_codes_and_wait_statuses():
    assert split_exit(0) == (0, None)
    assert split_exit(-9) == (137, 9)
    assert split_exit(137) == (137, 9)
    assert split_exit(78) == (78, None)
    assert split_exit(255) == (255, None)
    assert status_data(None) == {}
    assert status_data(9) == {"exit_code": 137, "signal": "SIGKILL"}  # killed by SIGKILL
    assert status_data(3 << 8) == {"exit_code": 3}


def test_oom_kills_are_read_from_this_processs_cgroup(tmp_path):
    (tmp_path / "cgroup").write_text("0::/slurm/job_42/step_0\n")
    events = tmp_path / "fs" / "slurm" / "job_42" / "step_0" / "memory.events"
    assert cgroup_events(str(tmp_path / "cgroup"), str(tmp_path / "fs")) == str(events)
    assert oom_kills(str(events)) is None  # no such file: unknown
    events.parent.mkdir(parents=True)
    events.write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    assert oom_kills(str(events)) == 2


def test_the_script_a_command_runs_names_the_job():
    assert guess_script(["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "1"]) == (
        "train.py"
    )
    assert guess_script(["srun", "-N2", "bash", "job.sh"]) == "job.sh"
    assert guess_script(["python", "-m", "pkg.train"]) == "python"


def test_launch_json_as_the_wrapper_reads_it(tmp_path):
    assert read_launch(str(tmp_path)) is None
    (tmp_path / "launch.json").write_text("{not json")
    assert read_launch(str(tmp_path)) is None
    (tmp_path / "launch.json").write_text("[1, 2]")
    assert read_launch(str(tmp_path)) is None
    LaunchState(str(tmp_path), job="j", attempt=4, launch="te:x:r0/n:1").save(ready=True)
    assert read_launch(str(tmp_path)) == {
        "job": "j",
        "attempt": 4,
        "launch": "te:x:r0/n:1",
        "ready": True,
        "ended": False,
        "reports": True,
    }


def _state(attempt, launch, **kw):
    return {"job": "j", "attempt": attempt, "launch": launch, "ready": False, "ended": False, **kw}


def test_a_new_launch_over_an_unended_one_is_a_death_and_the_workers_date_it():
    w = Watch()
    assert w.see(None) is None
    assert w.see(_state(1, "a")) is None
    w.see_workers({101, 102}, at=10.0)
    assert w.see(_state(1, "a", ready=True)) is None  # the same launch, now ready
    assert w.current["ready"] is True and len(w.launches) == 1
    w.see_workers({101}, at=12.5)  # rank 1 died
    w.see_workers(set(), at=12.9)  # torchrun closed the group
    assert w.death_ts == 12.5
    superseded = w.see(_state(2, "b"))  # torchrun's restart: launch 2 started
    assert superseded["attempt"] == 1 and superseded["ready"] is True
    assert superseded["_death"] == (12.5, None)
    assert w.death_ts is None  # launch 2's deaths are its own
    # A launch that ended itself is no death when the next one comes.
    assert w.see(_state(2, "b", ended=True)) is None
    w.see_workers({201}, at=20.0)
    w.see_workers(set(), at=21.0)
    assert w.death_ts is None  # its workers left after it ended: no death
    assert w.see(_state(3, "c")) is None
    # The console refused the next launch: a refusal, no launch.
    assert w.see({**_state(None, "d"), "refused": {"code": "crash_loop", "detail": "x"}}) is None
    assert w.refused == {"code": "crash_loop", "detail": "x"}
    assert [s["attempt"] for s in w.launches] == [1, 2, 3]


def test_the_wrappers_end_has_the_agents_id():
    assert event_id(7, "te:x:r1/n:ab", "attempt_ended") == (
        f"launch-7-{identity_digest('te:x:r1/n:ab')}-attempt_ended"
    )


# --- the wrapper around real (stdlib) processes --------------------------------------------

# A stand-in for rank 0 under torchrun: it writes launch.json as agent.init does, then
# does what the test asks (argv: a list of JSON steps).
RANK = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from agent.launch_env import LaunchState
    names = ("REBOUND_LAUNCH_STATE", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    env = {k: os.environ.get(k) for k in names}
    print("ENV " + json.dumps(env), flush=True)
    state_dir = os.environ["REBOUND_LAUNCH_STATE"]
    for step in json.loads(sys.argv[1]):
        if step[0] == "launch":
            LaunchState(state_dir, job="wrapped", attempt=step[1], launch=step[2]).save(**step[3])
        elif step[0] == "sleep":
            time.sleep(step[1])
        elif step[0] == "kill":
            os.kill(os.getpid(), step[1])
        elif step[0] == "exit":
            sys.exit(step[1])
    """
)


@pytest.fixture
def console():
    c = FakeConsole().start()
    yield c
    c.stop()


def wrapper(tmp_path, console, steps, *, wait=True, extra_env=None):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("REBOUND_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "REBOUND_URL": console.url,
            "REBOUND_TOKEN": TOKEN,
            "REBOUND_JOB": "wrapped",
            "REBOUND_NODE": "node-a",
            **(extra_env or {}),
        }
    )
    cmd = [sys.executable, "-m", "agent.launch", "--poll-s", "0.05", "--report-retry-s", "5"]
    cmd += ["--", sys.executable, str(script), json.dumps(steps)]
    p = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if wait:
        p.output = p.communicate(timeout=60)[0]
    return p


def ends(console):
    return [e for e in console.stored.values() if e["kind"] == "attempt_ended"]


def test_a_launch_killed_by_sigkill_is_ended_failed_by_the_wrapper(tmp_path, console):
    p = wrapper(tmp_path, console, [["launch", 5, "te:x:r0/n:1", {"ready": True}], ["kill", 9]])
    assert p.returncode == 137, p.output  # the child's code, as a shell says it
    env = json.loads(p.output.split("ENV ", 1)[1].splitlines()[0])
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert env["REBOUND_LAUNCH_STATE"]
    [end] = ends(console)
    assert end["id"] == event_id(5, "te:x:r0/n:1", "attempt_ended")
    assert (end["job"], end["attempt"], end["node"]) == ("wrapped", 5, "node-a")
    data = end["data"]
    assert (data["reason"], data["exit_code"], data["signal"]) == ("failed", 137, "SIGKILL")
    assert data["node"] == "node-a" and data["ready"] is True and "never_ready" not in data


def test_a_launch_the_ranks_ended_is_left_alone(tmp_path, console):
    steps = [["launch", 2, "n:2", {"ready": True}], ["launch", 2, "n:2", {"ended": True}]]
    p = wrapper(tmp_path, console, steps)
    assert p.returncode == 0, p.output
    assert console.stored == {}


def test_a_restart_ends_the_launch_before_it_and_a_launch_never_ready_says_so(tmp_path, console):
    steps = [
        ["launch", 1, "te:r:r0/n:1", {"ready": True}],
        ["sleep", 0.3],
        ["launch", 2, "te:r:r1/n:2", {}],  # torchrun restarted: a new launch
        ["sleep", 0.3],
        ["exit", 4],
    ]
    p = wrapper(tmp_path, console, steps)
    assert p.returncode == 4, p.output
    by_attempt = {e["attempt"]: e["data"] for e in ends(console)}
    assert by_attempt[1]["reason"] == "failed" and by_attempt[1]["ready"] is True
    assert "restarted" in by_attempt[1]["message"]
    assert by_attempt[2]["reason"] == "failed" and by_attempt[2]["exit_code"] == 4
    assert by_attempt[2]["never_ready"] is True and by_attempt[2]["ready"] is False
    assert "never became ready" in by_attempt[2]["message"]


def test_a_node_without_rank_0_ends_no_launch(tmp_path, console):
    """Its launch.json says `reports: false`: rank 0's node ends the launches."""
    steps = [
        ["launch", 1, "te:r:r0/n:1", {"reports": False}],
        ["sleep", 0.3],
        ["launch", 2, "te:r:r1/n:2", {"reports": False}],  # a restart after a death
        ["sleep", 0.3],
        ["exit", 1],
    ]
    p = wrapper(tmp_path, console, steps)
    assert p.returncode == 1, p.output
    assert console.stored == {} and console.launches == {}


@pytest.mark.parametrize(
    ("command", "environ", "first"),
    [
        (["python", "train.py"], {}, True),
        (["torchrun", "--standalone", "--nproc-per-node=8", "t.py"], {}, True),
        (["torchrun", "--nnodes", "1", "t.py"], {}, True),
        (["torchrun", "--nnodes=4", "--rdzv-backend=c10d", "t.py"], {}, False),
        (["torchrun", "--nnodes", "2:4", "t.py"], {}, False),
        (["torchrun", "--nnodes=4", "--node-rank=0", "t.py"], {}, True),
        (["torchrun", "--nnodes=4", "--node_rank", "3", "t.py"], {}, False),
        (["python", "-m", "torch.distributed.run", "--nnodes=2", "t.py"], {}, False),
        (["torchrun", "--nnodes=4", "t.py"], {"SLURM_PROCID": "0"}, True),
        (["srun", "torchrun", "t.py"], {"SLURM_PROCID": "0"}, True),
        (["python", "train.py"], {"SLURM_PROCID": "3"}, False),
    ],
)
def test_only_the_first_node_reports_a_job_that_never_started(command, environ, first):
    assert first_node(command, environ) is first


def test_a_job_that_never_reached_init_gets_a_launch_saying_it_never_started(tmp_path, console):
    p = wrapper(tmp_path, console, [["exit", 2]])
    assert p.returncode == 2, p.output
    [identity] = console.launches["wrapped"]
    assert identity.startswith("launcher:node-a/n:")
    kinds = console.kinds()
    assert kinds == ["attempt_started", "attempt_ended"]
    started, ended = (console.stored[i] for i in console.order)
    assert started["attempt"] == ended["attempt"] == 1
    assert started["data"]["world_size"] == 1
    assert ended["data"]["reason"] == "failed" and ended["data"]["never_started"] is True
    assert "never started" in ended["data"]["message"]
    assert ended["id"] == event_id(1, identity, "attempt_ended")


def test_a_refused_launch_stops_the_command_at_once_and_reports_no_crash(tmp_path, console):
    refused = {"code": "crash_loop", "detail": "job wrapped is in a crash loop (incident #9)"}
    steps = [["launch", None, "n:9", {"refused": refused, "ended": True}], ["sleep", 60]]
    t0 = time.monotonic()
    p = wrapper(tmp_path, console, steps)
    assert time.monotonic() - t0 < 10  # not the child's minute
    assert p.returncode == EXIT_REFUSED, p.output
    assert "refused a new launch (crash_loop): job wrapped is in a crash loop" in p.output
    assert console.stored == {}


def test_sigterm_to_the_wrapper_reaches_the_command_and_ends_the_launch_preempted(
    tmp_path, console
):
    steps = [["launch", 3, "n:3", {"ready": True}], ["sleep", 60]]
    p = wrapper(tmp_path, console, steps, wait=False)
    assert wait_for(lambda: (tmp_path / "rank.py").exists(), timeout=10)
    time.sleep(1.5)  # the child is up and launch.json written
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=20)[0]
    assert p.returncode == 143, out  # the child died of the forwarded SIGTERM
    [end] = ends(console)
    assert end["data"]["reason"] == "preempted"
    assert end["data"]["requested_by"] == "scheduler"
    assert end["data"]["signal"] == "SIGTERM"


def test_the_wrappers_end_is_stored_once_when_sent_again(console):
    from agent.launch import Sender

    event = {
        "id": event_id(1, "n:1", "attempt_ended"),
        "job": "j",
        "kind": "attempt_ended",
        "ts": time.time(),
        "attempt": 1,
        "data": {"reason": "failed"},
    }
    sender = Sender(console.url, TOKEN, retry_s=5)
    sender.send([event])
    sender.send([event])
    assert sender.close()
    assert len(console.stored) == 1 and len(console.requests) == 2


def test_a_console_away_is_asked_again(console):
    from agent.launch import Sender

    console.script.extend([503, 503])
    sender = Sender(console.url, TOKEN, retry_s=10)
    sender.send([{"id": "x", "job": "j", "kind": "attempt_ended", "ts": time.time(), "attempt": 1}])
    assert sender.close()
    assert [r.status for r in console.requests] == [503, 503, 202]
