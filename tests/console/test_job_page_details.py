"""The job page read as a person reads it: checkpoints on the progress line, axis titles
with room, no chart of a badput that is not there, sizes and durations in units and
digits that fit, one way of writing a number wherever it appears twice."""

import re

import numpy as np
import pytest

from console import charts as fmt
from jobs.models import Checkpoint, TrainingJob
from jobs.services import cluster_get_or_create, events_ingest
from jobs.wire import validate_events
from tests.console.test_job_page import T0, charts, ingest_job, trace

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client, personas):
    client.force_login(personas["viewer"].user)
    return client


def segments(line: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """The progress line's launches: runs of points between the gaps (null steps)."""
    out, xs, ys = [], [], []
    for x, y in zip(line["x"], line["y"], strict=True):
        if y is None:
            out.append((np.array(xs, float), np.array(ys, float)))
            xs, ys = [], []
        else:
            xs.append(x)
            ys.append(y)
    out.append((np.array(xs, float), np.array(ys, float)))
    return out


def test_checkpoint_markers_sit_on_the_progress_line(viewer):
    ingest_job("ckpt-job", launches=3, steps_per_launch=150)
    fig = charts(viewer.get("/jobs/ckpt-job/").content.decode())["chart-progress"]
    parts = segments(trace(fig, "step reached"))
    markers = [t for t in fig["data"] if t["name"].startswith("checkpoint")]
    assert sum(len(t["x"]) for t in markers) >= 5
    for t in markers:
        for x, y in zip(t["x"], t["y"], strict=True):
            on = [np.interp(x, xs, ys) for xs, ys in parts if len(xs) and xs[0] <= x <= xs[-1]]
            assert any(abs(v - y) < 0.01 for v in on), (x, y, on)


def test_axis_titles_have_room(viewer):
    fig = fmt.layout("t", "step", "step time (s)")
    assert fig["xaxis"]["automargin"] and fig["yaxis"]["automargin"]
    # The step-time chart's axis title is short: where the times come from is in its title.
    ingest_job("axis-job", launches=1, steps_per_launch=150)
    steptime = charts(viewer.get("/jobs/axis-job/").content.decode())["chart-steptime"]
    assert steptime["layout"]["yaxis"]["title"]["text"] == "step time (s)"
    assert steptime["layout"]["yaxis"]["automargin"]
    assert "(reported)" in steptime["layout"]["title"]["text"]


def clean_job(key="clean-run") -> TrainingJob:
    """One GPU, 300 steps, 0.07 s of startup: next to nothing is badput."""
    events = []

    def emit(kind, ts, **data):
        events.append(
            {"id": f"{key}-{len(events)}", "job": key, "kind": kind, "ts": ts, "attempt": 1}
            | {"data": data}
        )

    emit("attempt_started", T0, world_size=1, gpus_per_node=1, nodes=["c-node"])
    emit("ready", T0 + 0.07)
    for s in range(1, 301):
        emit("step", T0 + 0.07 + s, step=s, loss=1 / s, step_time_s=1.0)
    emit("checkpoint_save_started", T0 + 300.07, step=300)
    emit("checkpoint_saved", T0 + 300.07, step=300, bytes=48_213_504, blocking_s=0.123456)
    emit("attempt_ended", T0 + 300.07, reason="completed")
    emit("job_finished", T0 + 300.07)
    valid, errors = validate_events(events, 5000)
    assert not errors
    events_ingest(cluster=cluster_get_or_create(name="east"), events=valid)
    return TrainingJob.objects.get(key=key)


def test_a_job_without_badput_to_speak_of_has_no_badput_chart_and_says_so(viewer):
    clean_job()
    html = viewer.get("/jobs/clean-run/").content.decode()
    assert "chart-badput" not in charts(html) and 'id="chart-badput"' not in html
    assert "Next to no badput: 0.07 GPU-seconds (0.02%) of 0.0834 GPU-hours" in html
    assert not re.search(r"\de-0\d", html)  # no number written with an exponent


def test_checkpoint_sizes_and_blocking_in_units_that_fit(viewer):
    clean_job()
    html = viewer.get("/jobs/clean-run/").content.decode()
    table = html.split("<h2>Checkpoints</h2>")[1]
    assert "48.2 MB" in table and "0.123" in table and "0.123456" not in table
    assert [fmt.byte_size(n) for n in (0, 999, 48_213_504, 10**9, 1_530_000_000_000)] == [
        "0 B",
        "999 B",
        "48.2 MB",
        "1 GB",
        "1.53 TB",
    ]


def test_significant_never_writes_an_exponent():
    values = (0.0, 0.5411, 0.08, 1.94e-05, 12.345, 1234.5, 0.9996, -0.25)
    assert [fmt.significant(v) for v in values] == [
        "0",
        "0.541",
        "0.08",
        "0.0000194",
        "12.3",
        "1,234",
        "1",
        "-0.25",
    ]


def test_the_what_if_text_and_table_write_the_optimum_alike(viewer):
    ingest_job("whatif-job", launches=3, steps_per_launch=150)
    # A checkpoint cost that makes the optimum a fraction of a minute.
    Checkpoint.objects.filter(job__key="whatif-job").update(blocking_s=0.01)
    html = viewer.get("/jobs/whatif-job/?checkpoint_s=0.01").content.decode()
    text = re.search(r"Young <b>([^<]+) min</b>", html).group(1)
    row = re.search(r"<td>Young optimum</td><td class=\"num\">([^<]+)</td>", html).group(1)
    assert text == row
