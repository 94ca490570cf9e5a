"""agent.launch_env without torch: the environment a launch reads, its identity, the
launch number asked of a console (a small stdlib HTTP server here: retries, refusals,
a console that stays away) and the launch state file."""

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent import launch_env as le

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "TORCHELASTIC_RUN_ID": "5f0c2b",
    "TORCHELASTIC_RESTART_COUNT": "2",
}


# --- the environment -----------------------------------------------------------------


def test_torchrun_variables_and_defaults():
    env = le.read_env(
        {**TORCHRUN, "REBOUND_URL": "http://c:8000", "REBOUND_TOKEN": "t"}, argv0="/x/train.py"
    )
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 8, 1, 4)
    assert env.job == "train"  # the script's name without .py
    assert env.node  # the host name
    assert env.heartbeat_s == 10.0
    assert env.retry_s == 60.0
    assert env.reporting
    assert env.launcher() == {"torchelastic": {"run_id": "5f0c2b", "restart_count": 2}}


def test_a_bare_process_is_a_world_of_one_reporting_nothing():
    env = le.read_env({}, argv0="train.py")
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (0, 1, 0, None)
    assert not env.reporting
    assert env.launcher() == {}


def test_the_job_name_comes_from_rebound_job_then_slurm_then_the_script():
    assert (
        le.read_env({"REBOUND_JOB": "llm-7b", "SLURM_JOB_NAME": "x"}, argv0="t.py").job == "llm-7b"
    )
    assert le.read_env({"SLURM_JOB_NAME": "pretrain.sbatch"}, argv0="t.py").job == "pretrain"
    assert le.read_env({"SLURM_JOB_NAME": "my job!"}, argv0="t.py").job == "my-job"
    assert le.read_env({}, argv0="/home/a/run v2.py").job == "run-v2"
    assert le.read_env({}, argv0="").job == "job"
    assert len(le.read_env({}, argv0="x" * 300 + ".py").job) == 100


def test_slurm_variables_stand_in_for_torchruns_under_a_bare_srun():
    slurm = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS_PER_NODE": "8(x2)",
        "SLURM_JOB_ID": "4242",
        "SLURM_RESTART_COUNT": "1",
        "SLURM_JOB_NODELIST": "gpu[001-002]",
        "SLURMD_NODENAME": "gpu001",
    }
    env = le.read_env(slurm, argv0="t.py")
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (5, 16, 1, 8)
    assert env.launcher() == {
        "slurm": {"job_id": "4242", "restart_count": 1, "nodelist": "gpu[001-002]"}
    }
    # torchrun's set wins whole when present (srun running torchrun)
    env = le.read_env({**slurm, **TORCHRUN}, argv0="t.py")
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 8, 1, 4)


def test_the_token_may_come_from_a_file(tmp_path):
    f = tmp_path / "token"
    f.write_text("sekrit\n")
    env = le.read_env({"REBOUND_URL": "http://c", "REBOUND_TOKEN_FILE": str(f)}, argv0="t.py")
    assert env.token == "sekrit"
    with pytest.raises(le.EnvError, match="REBOUND_TOKEN_FILE"):
        le.read_env({"REBOUND_TOKEN_FILE": str(tmp_path / "none")}, argv0="t.py")


@pytest.mark.parametrize(
    "bad",
    [
        {"RANK": "x"},
        {"RANK": "2", "WORLD_SIZE": "2"},
        {"WORLD_SIZE": "0"},
        {"REBOUND_HEARTBEAT_S": "-1"},
        {"REBOUND_HEARTBEAT_S": "soon"},
    ],
)
def test_what_cannot_be_read_is_an_env_error(bad):
    with pytest.raises(le.EnvError):
        le.read_env(bad, argv0="t.py")


# --- the identity --------------------------------------------------------------------


def test_the_identity_is_the_launchers_ids_and_a_nonce():
    env = le.read_env(
        {**TORCHRUN, "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "3"}, argv0="t.py"
    )
    assert le.launch_identity(env, "abcd") == "te:5f0c2b:r2/slurm:4242:r3/n:abcd"
    assert le.launch_identity(le.read_env({}, argv0="t.py"), "abcd") == "n:abcd"


def test_no_two_launches_share_an_identity_even_with_the_same_launcher_ids():
    """torchrun's default run id is "none" for every launch: the nonce tells them apart."""
    env = le.read_env(
        {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0"}, argv0="t.py"
    )
    ids = {le.launch_identity(env, le.new_nonce()) for _ in range(1000)}
    assert len(ids) == 1000


def test_an_identity_is_printable_ascii_within_200_characters():
    env = le.read_env(
        {
            "TORCHELASTIC_RUN_ID": "ü/" + "r" * 500,
            "SLURM_JOB_ID": "a/b\nc",
            "SLURM_RESTART_COUNT": "0",
        },
        argv0="t.py",
    )
    identity = le.launch_identity(env, le.new_nonce())
    assert 1 <= len(identity) <= 200
    assert all(" " <= c <= "~" for c in identity)
    te, slurm, nonce = identity.split("/")
    assert te.startswith("te:h") and len(te) < 40  # a long run id is replaced by its digest
    assert slurm == "slurm:a_b_c:r0"
    assert nonce.startswith("n:")


# --- the launch number ---------------------------------------------------------------


class Console:
    """A console answering POST /api/v1/launches from a script of (status, body) answers."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.requests = []
        console = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                console.requests.append((self.path, self.headers["Authorization"], body))
                status, answer = console.answers.pop(0) if console.answers else (503, {})
                raw = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def console():
    made = []

    def make(answers):
        c = Console(answers)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def _reserve(url, **kw):
    kw.setdefault("retry_s", 5)
    return le.reserve(url, "tok", "llm-7b", "n:1", backoff_base_s=0.01, backoff_cap_s=0.02, **kw)


def test_the_number_is_asked_of_the_console(console):
    c = console([(201, {"job": "llm-7b", "attempt": 4, "launch": "n:1", "created": True})])
    got = _reserve(c.url)
    assert got == le.Reservation(job="llm-7b", attempt=4, launch="n:1", created=True)
    assert c.requests == [("/api/v1/launches", "Bearer tok", {"job": "llm-7b", "launch": "n:1"})]


def test_a_console_that_is_away_for_a_while_is_asked_again(console):
    ok = (200, {"job": "llm-7b", "attempt": 2, "launch": "n:1", "created": False})
    c = console([(503, {"error": "unavailable", "detail": "db away"}), (429, {}), (502, {}), ok])
    assert _reserve(c.url).attempt == 2
    assert len(c.requests) == 4


def test_a_console_that_stays_away_gives_up_within_its_bound(console):
    c = console([])  # 503 for ever
    waits = []
    now = [0.0]

    def sleep(s):
        waits.append(s)
        now[0] += s

    with pytest.raises(le.ConsoleAway, match="HTTP 503"):
        _reserve(c.url, retry_s=3.0, sleep=sleep, clock=lambda: now[0])
    assert sum(waits) == pytest.approx(3.0)
    assert len(c.requests) >= 3


def test_no_console_at_all_gives_up_within_its_bound():
    with pytest.raises(le.ConsoleAway, match="Connection"):
        le.reserve("http://127.0.0.1:9", "t", "j", "n:1", retry_s=0.2, backoff_base_s=0.01)


def test_a_refusal_carries_the_consoles_code_and_detail(console):
    detail = "job llm-7b finished at 2026-12-01T10:00:00Z; reopen it with POST ..."
    c = console([(409, {"error": "job_finished", "detail": detail, "job": "llm-7b"})])
    with pytest.raises(le.LaunchRefused) as refused:
        _reserve(c.url)
    assert (refused.value.code, refused.value.detail) == ("job_finished", detail)
    assert len(c.requests) == 1  # a refusal is not retried


@pytest.mark.parametrize("status", [400, 401, 403])
def test_an_error_no_retry_mends_is_not_retried(console, status):
    c = console([(status, {"error": "x", "detail": "Your role may not do this."})] * 3)
    with pytest.raises(le.ConsoleAway, match="Your role may not"):
        _reserve(c.url)
    assert len(c.requests) == 1


# --- the launch state ----------------------------------------------------------------


def test_the_launch_state_is_replaced_whole(tmp_path):
    state = le.LaunchState(str(tmp_path / "s"), job="llm-7b", attempt=3, launch="n:1")
    state.save()
    assert le.read_state(str(tmp_path / "s")) == {
        "job": "llm-7b", "attempt": 3, "launch": "n:1", "ready": False, "ended": False,
        "reports": True,
    }  # fmt: skip
    state.save(ready=True)
    state.save(ended=True)
    assert le.read_state(str(tmp_path / "s"))["ready"] is True
    assert le.read_state(str(tmp_path / "s"))["ended"] is True
    assert os.listdir(tmp_path / "s") == ["launch.json"]  # no temporary file left behind
    assert le.read_state(str(tmp_path / "none")) is None


def test_a_state_that_cannot_be_written_does_not_take_the_job_down(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    le.LaunchState(str(tmp_path / "file"), job="j", attempt=1, launch="n:1").save()
    assert "cannot write the launch state" in capsys.readouterr().err


def test_the_process_start_is_in_the_past():
    import time

    started = le.process_started_at()
    assert time.time() - 3600 < started <= time.time()
