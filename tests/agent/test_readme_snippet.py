"""The README's instrumentation snippet, verbatim, as a whole training script under
`torchrun --standalone --nproc-per-node 2` (CPU, gloo) against a live console; checked
through the API. And its resubmission once the job finished: refused, clearly."""

import re
from pathlib import Path

import pytest

from agent.launch_env import EXIT_REFUSED, read_state
from console.services import token_issue
from jobs.models import Attempt, Event, LaunchReservation
from tests.agent.torchrun import ROOT, torchrun

pytestmark = [pytest.mark.engine_free, pytest.mark.django_db(transaction=True)]

MARKER = "<!-- readme-snippet: instrument"
JOB = "readme-snippet"


def readme_snippet() -> str:
    """The first ```python block after the README's marker, as it stands."""
    text = (ROOT / "README.md").read_text()
    after = text[text.index(MARKER) :]
    match = re.search(r"```python\n(.*?)\n```", after, re.S)
    assert match is not None, "the README's marked snippet is not a python block"
    return match.group(1) + "\n"


def test_the_snippet_is_the_readmes_instrumentation_section():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Instrumenting a torch job") :]
    assert section.index(MARKER) < section.index("\n## ")
    code = readme_snippet()
    assert "agent.init(model)" in code and "inst.finish()" in code
    compile(code, "README.md", "exec")


def test_the_readme_snippet_runs_and_its_job_is_accounted(tmp_path, live_server, personas):
    script = tmp_path / "train.py"
    script.write_text(readme_snippet())
    _, token = token_issue(scope="ingest", cluster_name="east")
    env = {"CKPT_DIR": str(tmp_path / "ckpt"), "REBOUND_LAUNCH_STATE": str(tmp_path / "state")}
    run = torchrun(script, url=live_server.url, token=token, job=JOB, env=env)
    assert run.returncode == 0, run.output
    assert "reporting is off" not in run.output

    api = personas["viewer"].client()
    job = api.get(f"/api/v1/jobs/{JOB}/").json()
    assert job["status"] == "completed", job
    launches = api.get(f"/api/v1/jobs/{JOB}/attempts").json()
    launches = launches.get("results", launches)
    assert len(launches) == 1
    launch = launches[0]
    assert launch["number"] == 1
    assert (launch["world_size"], launch["gpus_per_node"]) == (2, 2)
    assert launch["started_at"] and launch["ready_at"] and launch["ended_at"]
    assert launch["end_reason"] == "completed"
    assert len(launch["nodes"]) == 1  # both ranks on this host: one node

    goodput = api.get(f"/api/v1/jobs/{JOB}/goodput").json()
    elapsed = goodput["elapsed_s"]
    # Two ranks are two GPUs: GPU-seconds are twice the elapsed time, to the second.
    assert sum(goodput["gpu_seconds"].values()) == pytest.approx(2 * elapsed, abs=1.0)
    # The launch ran from its processes' start to the finish: within torchrun's wall time.
    assert 0 < elapsed <= run.wall_s + 0.5
    assert elapsed > run.wall_s - 15, (elapsed, run.wall_s)
    # Startup (importing torch, the rendezvous, building the model) is not productive.
    assert goodput["categories"]["startup"] > 0
    assert goodput["goodput"] < 1.0 and goodput["gpu_goodput"] < 1.0
    assert goodput["categories"]["productive"] > 0

    # Every rank reported with the one launch number rank 0 was handed.
    stored = Event.objects.filter(job__key=JOB)
    assert set(stored.values_list("attempt", flat=True).exclude(kind="heartbeat")) == {1}
    assert set(stored.filter(kind="rank_window").values_list("rank", flat=True)) == {0, 1}
    assert stored.filter(kind="step").count() == 200
    assert stored.filter(kind="checkpoint_saved").count() == 4
    kinds = list(
        stored.filter(
            kind__in=("attempt_started", "ready", "attempt_ended", "job_finished")
        ).values_list("kind", flat=True)
    )
    assert sorted(kinds) == ["attempt_ended", "attempt_started", "job_finished", "ready"]
    assert read_state(str(tmp_path / "state")) == {
        "job": JOB,
        "attempt": 1,
        "launch": LaunchReservation.objects.get(job__key=JOB).identity,
        "ready": True,
        "ended": True,
        "reports": True,
    }

    # (d) The same job submitted again after it finished: refused, saying what to do;
    # no launch 2, nothing stored, and every rank exits with EXIT_REFUSED.
    events_before = stored.count()
    again = torchrun(script, url=live_server.url, token=token, job=JOB, env=env)
    assert again.returncode != 0
    assert f"job {JOB} finished at " in again.output
    assert f"reopen it with POST /api/v1/jobs/{JOB}/reopen or use another job name" in again.output
    assert re.search(rf"exitcode\s*:\s*{EXIT_REFUSED}\b", again.output), again.output
    state = read_state(str(tmp_path / "state"))
    assert state["refused"]["code"] == "job_finished"
    assert state["attempt"] is None
    assert Attempt.objects.filter(job__key=JOB).count() == 1
    assert LaunchReservation.objects.filter(job__key=JOB).count() == 1
    assert Event.objects.filter(job__key=JOB).count() == events_before
    assert not Path(tmp_path / "ckpt" / "step-201").exists()
