"""The overview page: who may see it, the node grid and its live states, the running
jobs' goodput (cumulative and last hour), open incidents, approvals, the GPU-hours
lost, and a query count that does not grow with the rows."""

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.charts import NODE_STATE_COLOURS
from incidents.models import Incident
from incidents.selectors import lost_gpu_hours_recent
from jobs.accounting import job_ledger
from jobs.models import (
    LedgerSnapshot,
    Node,
    TrainingJob,
)
from jobs.selectors import jobs_recent_goodput
from recovery.models import Action
from tests.factories import (
    ActionFactory,
    AttemptFactory,
    CheckpointFactory,
    ClusterFactory,
    LedgerSnapshotFactory,
    NodeFactory,
    StepRecordFactory,
    TrainingJobFactory,
    incident_row,
)

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0


def dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def figures(goodput: float, gpu_goodput: float) -> dict:
    cats = dict.fromkeys(
        (
            "productive",
            "startup",
            "checkpoint_restore",
            "checkpoint_save",
            "wasted_progress",
            "stalled",
            "downtime",
            "other",
        ),
        0.0,
    )
    cats["productive"] = goodput * 100
    cats["other"] = 100 - cats["productive"]
    return {
        "job": "x",
        "elapsed_s": 100.0,
        "categories": cats,
        "gpu_seconds": cats,
        "goodput": goodput,
        "gpu_goodput": gpu_goodput,
        "slowdown_s": 0.0,
        "as_of": None,
    }


def make_job(cluster, key, *, snapshot=True, status=TrainingJob.Status.RUNNING, launch=False):
    job = TrainingJobFactory(
        key=key,
        cluster=cluster,
        status=status,
        first_event_ts=T0,
        last_event_ts=T0 + 7200,
        last_step=700,
        last_step_ts=T0 + 7200,
    )
    if snapshot:
        LedgerSnapshotFactory(job=job, revision=0, figures=figures(0.83, 0.81))
    if launch:  # a launch with its first step, and a checkpoint in the last hour
        AttemptFactory(job=job, number=1, world_size=8, started_at=dt(T0))
        StepRecordFactory(job=job, attempt=1, step=1, ts=T0 + 60)
        CheckpointFactory(
            job=job,
            attempt=1,
            step=600,
            save_started_at=dt(T0 + 6000),
            saved_at=dt(T0 + 6040),
            blocking_s=36.0,
        )
    return job


XID = {"detector": "test", "cause": "gpu", "fault_type": "gpu_xid", "summary": "Xid 79 on a node"}


def make_incident(job, *, fault_at=None, lost_s=0.0, state=Incident.State.OPEN, nodes=()):
    return incident_row(
        job,
        fault_at=fault_at,
        nodes=nodes,
        lost_s=lost_s,
        state=state,
        **XID,
    )


def seed(n_clusters, nodes_per_cluster, n_jobs, n_incidents, n_actions, prefix="c"):
    """Clusters `{prefix}0..` of nodes in every state in turn, running jobs with cached
    ledgers, open incidents on two nodes each, actions waiting for approval."""
    states = [s.value for s in Node.State]
    clusters = [ClusterFactory(name=f"{prefix}{i}") for i in range(n_clusters)]
    all_nodes = []
    for c in clusters:
        all_nodes += Node.objects.bulk_create(
            Node(cluster=c, name=f"n{i:04d}", state=states[i % len(states)], gpus=8)
            for i in range(nodes_per_cluster)
        )
    jobs = [
        make_job(clusters[i % n_clusters], f"{prefix}-job-{i}", launch=True) for i in range(n_jobs)
    ]
    for i in range(n_incidents):
        make_incident(jobs[i % n_jobs], nodes=all_nodes[i : i + 2], lost_s=3600.0)
    for i in range(n_actions):
        ActionFactory(
            kind=Action.Kind.CORDON_NODE,
            state=Action.State.AWAITING_APPROVAL,
            cluster=all_nodes[i].cluster,
            node=all_nodes[i],
            requested_by="someone",
            reason="test",
        )
    return clusters, all_nodes, jobs


# --- who may see it ------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["viewer", "operator", "admin"])
def test_roles_see_the_overview(client, personas, persona):
    seed(1, 8, 1, 1, 1)
    client.force_login(personas[persona].user)
    r = client.get("/")
    assert r.status_code == 200
    html = r.content.decode()
    assert 'data-live-nodes="all"' in html  # status.json then returns every node's state
    assert html.count("data-live-node=") == 7  # 8 nodes, the retired one not drawn
    assert "GPU-hours lost today" in html and "Waiting for approval" in html
    # The seeded job stepped all hour but for a 36 s save: 99%, exact (no "≥").
    assert re.search(r'<span title="[^"]*">99%</span></td>', html)
    assert "≥ " not in html.split('class="note"')[0]


def test_outsiders_are_refused_and_strangers_sent_to_sign_in(client, personas):
    assert client.get("/").status_code == 302
    assert "/login/" in client.get("/")["Location"]
    client.force_login(personas["outsider"].user)
    assert client.get("/").status_code == 403


# --- the node grid -------------------------------------------------------------------


def test_the_grid_colours_names_and_links_every_node(client, personas):
    c = ClusterFactory(name="east")
    a = NodeFactory(cluster=c, name="a01", state=Node.State.ACTIVE)
    b = NodeFactory(cluster=c, name="b02", state=Node.State.IN_REPAIR)
    NodeFactory(cluster=c, name="r03", state=Node.State.RETIRED)
    other = ClusterFactory(name="west")
    w = NodeFactory(cluster=other, name="w01", state=Node.State.CORDONED)
    client.force_login(personas["viewer"].user)
    html = client.get("/").content.decode()
    for node, label in ((a, "active"), (b, "in repair"), (w, "cordoned")):
        cell = re.search(rf'<a class="ns ncell"[^>]*data-live-node="{node.pk}"[^>]*>', html)
        assert cell, node
        cell = cell.group(0)
        assert f'href="/nodes/{node.cluster.name}/{node.name}/"' in cell
        assert f'data-state="{node.state}"' in cell
        assert f'data-name="{node.name}"' in cell
        assert f'title="{node.name}: {label}"' in cell
    assert 'data-name="r03"' not in html  # retired: counted, not drawn
    east = html[html.index(">east</a>") : html.index(">west</a>")]
    assert re.search(r'data-state="retired"></span>&nbsp;1', east)
    assert re.search(r'data-state="in_repair"></span>&nbsp;1', east)
    # The legend names every state with its letter, the second cue besides colour.
    for label in ("suspect (S)", "cordoned (C)", "draining (D)", "in repair (R)", "spare (+)"):
        assert label in html


def test_nodes_an_open_incident_names_are_ringed_with_the_incident_in_the_title(client, personas):
    c = ClusterFactory(name="east")
    slow, crashed, quiet, healed = (
        NodeFactory(cluster=c, name=n) for n in ("slow01", "crash02", "quiet03", "healed04")
    )
    job = make_job(c, "ringed-job")
    straggler = incident_row(job, nodes=[slow], cause="straggler", fault_type="slow_rank")
    first = incident_row(job, nodes=[crashed])
    newer = incident_row(job, nodes=[crashed], cause="gpu", fault_type="xid")
    incident_row(job, nodes=[healed], state=Incident.State.RESOLVED)
    client.force_login(personas["viewer"].user)
    html = client.get("/").content.decode()

    def cell(node):
        return re.search(rf'<a class="([^"]*)"[^>]*data-live-node="{node.pk}"[^>]*>', html)

    assert cell(slow).group(1) == "ns ncell incident"
    assert f'title="slow01: active; open incident #{straggler.pk} straggler (slow_rank)"' in (
        cell(slow).group(0)
    )
    assert f'data-incident="#{straggler.pk} straggler (slow_rank)"' in cell(slow).group(0)
    # the newest of a node's open incidents, and how many more
    assert f"open incident #{newer.pk} gpu (xid) and 1 more" in cell(crashed).group(0)
    assert first.pk < newer.pk
    for node in (quiet, healed):  # no incident, or none open
        assert cell(node).group(1) == "ns ncell" and "incident" not in cell(node).group(0)
    assert "ringed: named by an open incident" in html


def test_the_grid_of_2048_nodes_stays_within_the_page():
    """The grid wraps its fixed-size cells (no horizontal overflow at any width), and
    the columns below it shrink to a narrow window."""
    css = (Path(settings.BASE_DIR) / "static" / "css" / "overview.css").read_text()
    assert re.search(r"\.nodegrid \{[^}]*repeat\(auto-fill, 16px\)", css)
    assert "minmax(min(560px, 100%), 1fr)" in css
    assert re.search(r"\.nodegrid a\.incident[^{]*\{[^}]*box-shadow: inset", css)


def test_the_state_colours_and_letters_are_those_of_the_charts():
    """The CSS is static; it must keep the colours console.charts names, and each state
    other than active must carry a distinct letter."""
    css = (Path(settings.BASE_DIR) / "static" / "css" / "nodes.css").read_text()
    for state, colour in NODE_STATE_COLOURS.items():
        assert f'.ns[data-state="{state}"] {{ background: {colour}; }}' in css
    letters = re.findall(r'\.ncell\[data-state="(\w+)"\]::after[^{]*\{ content: "([^"]+)"', css)
    assert {s for s, _ in letters} == set(NODE_STATE_COLOURS) - {"active"}
    assert len({letter for _, letter in letters}) == len(letters)


def test_status_json_returns_every_node_state(client, personas):
    _, nodes, _ = seed(2, 5, 1, 0, 0)
    client.force_login(personas["viewer"].user)
    body = client.get("/status.json", {"nodes": "all"}).json()
    assert body["nodes"] == {str(n.pk): n.state for n in nodes}
    body = client.get("/status.json", {"nodes": "c1"}).json()
    assert body["nodes"] == {str(n.pk): n.state for n in nodes if n.cluster.name == "c1"}


# --- jobs, incidents, approvals, lost GPU-hours --------------------------------------


def test_running_jobs_show_cumulative_and_last_hour_goodput(client, personas):
    c = ClusterFactory(name="east")
    running = make_job(c, "llm-a")
    make_job(c, "llm-b", snapshot=False)
    make_job(c, "done", status=TrainingJob.Status.COMPLETED)
    client.force_login(personas["viewer"].user)
    html = client.get("/").content.decode()
    assert "showing 2 of 2" in html and ">done<" not in html
    row = re.search(r"<tr>\s*<td><a href=\"/jobs/llm-a/\">.*?</tr>", html, re.S).group(0)
    assert ">83%<" in row and ">81%<" in row  # the cached ledger
    # No launch rows: the last hour is unknown-to-zero, said to be a lower bound.
    assert "≥ 0%" in row and "no launch recorded" in row
    row_b = re.search(r"<tr>\s*<td><a href=\"/jobs/llm-b/\">.*?</tr>", html, re.S).group(0)
    assert "not computed yet" in row_b  # no snapshot: the page does not compute it
    assert LedgerSnapshot.objects.filter(job__key="llm-b").count() == 0
    assert running.ledger.figures["goodput"] == 0.83


def test_open_incidents_newest_first_and_approvals(client, personas):
    c = ClusterFactory(name="east")
    job = make_job(c, "llm")
    node = NodeFactory(cluster=c, name="n01")
    now = timezone.now()
    old = make_incident(job, fault_at=now - timedelta(hours=2))
    new = make_incident(job, fault_at=now - timedelta(minutes=5), state=Incident.State.OPEN)
    closed = make_incident(job, fault_at=now, state=Incident.State.RESOLVED)
    waiting = ActionFactory(
        kind=Action.Kind.CORDON_NODE,
        state=Action.State.AWAITING_APPROVAL,
        cluster=c,
        node=node,
        requested_by="policy:xid",
        blocked_by="storm",
        reason="x",
    )
    client.force_login(personas["viewer"].user)
    html = client.get("/").content.decode()
    assert html.index(f'/incidents/{new.pk}/"') < html.index(f'/incidents/{old.pk}/"')
    assert f'/incidents/{closed.pk}/"' not in html
    assert "showing 2 of 2, newest first" in html
    assert f"#{waiting.pk} Cordon Node" in html and "guardrail: storm" in html
    assert 'href="/approvals/"' in html


def test_gpu_hours_lost_sums_the_incidents_of_today_and_the_last_7_days(client, personas):
    c = ClusterFactory(name="east")
    job = make_job(c, "llm")
    now = timezone.now()
    make_incident(job, fault_at=now, lost_s=0.05 * 3600)  # today: small, not shown as 0.0
    make_incident(job, fault_at=now - timedelta(days=3), lost_s=5 * 3600)  # this week
    make_incident(job, fault_at=now - timedelta(days=10), lost_s=100 * 3600)  # older
    client.force_login(personas["viewer"].user)
    html = client.get("/").content.decode()
    assert re.search(r"GPU-hours lost today</span><b>0\.05</b>", html)
    assert re.search(r"GPU-hours lost, last 7 days</span><b>5\.05</b>", html)


def test_lost_gpu_hours_boundaries():
    c = ClusterFactory(name="east")
    job = make_job(c, "llm")
    now = datetime(2026, 3, 10, 6, 0, tzinfo=UTC)
    midnight = datetime(2026, 3, 10, tzinfo=UTC)
    make_incident(job, fault_at=midnight, lost_s=3600)  # today, at 00:00 UTC
    make_incident(job, fault_at=midnight - timedelta(seconds=1), lost_s=7200)  # yesterday
    make_incident(job, fault_at=now - timedelta(days=7), lost_s=10800)  # 7 days ago, sharp
    make_incident(job, fault_at=now - timedelta(days=7, seconds=1), lost_s=99 * 3600)
    make_incident(job, fault_at=now + timedelta(seconds=1), lost_s=99 * 3600)  # after now
    lost = lost_gpu_hours_recent(now=now)
    assert lost["today"] == pytest.approx(1.0)
    assert lost["week"] == pytest.approx(1.0 + 2.0 + 3.0)
    assert lost["today_since"] == midnight


# --- the last hour's goodput against the ledger --------------------------------------


def launch(job, attempt, start, *, until, step0=1, restore=False, saves=(), end=None):
    """Events of one launch: started at `start`, ready 20 s later, (restored 30 s
    later), a step every 10 s until `until`, saves of `step: blocking_s` (the save
    starts right after the step), ended at `end` (a crash) when given."""
    ev = []

    def add(kind, ts, **data):
        ev.append(
            {
                "id": f"{job}-{attempt}-{len(ev)}",
                "job": job,
                "kind": kind,
                "ts": ts,
                "attempt": attempt,
                "data": data,
            }
        )

    add("attempt_started", start, world_size=8, gpus_per_node=8, nodes=["n01"])
    add("ready", start + 20)
    t = start + 20
    if restore:
        add("checkpoint_load_started", t, step=step0 - 1)
        t += 30
        add("checkpoint_loaded", t, step=step0 - 1)
    step = step0
    while t + 10 <= until:
        t += 10
        add("step", t, step=step)
        if step in saves:
            add("checkpoint_save_started", t, step=step)
            add("checkpoint_saved", t + saves[step] + 1, step=step, blocking_s=saves[step])
            t += saves[step]
        step += 1
    if end is not None:
        add("fault", end - 1, type="crash")
        add("attempt_ended", end, reason="failed")
    return ev


def test_the_last_hour_is_the_ledgers_when_the_launch_covers_it(ingest):
    # A crash at T0+1000, a second launch from T0+1100 stepping for over an hour, with
    # saves (3 s and 7 s blocking) inside the last hour and one before it.
    events = launch("steady", 1, T0, until=T0 + 900, end=T0 + 1000)
    events += launch(
        "steady",
        2,
        T0 + 1100,
        until=T0 + 9000,
        step0=50,
        restore=True,
        saves={200: 5.0, 700: 3.0, 800: 7.0},
    )
    # A job whose second launch began 20 minutes before its last event.
    events += launch("fresh", 1, T0, until=T0 + 4000, saves={100: 4.0}, end=T0 + 4100)
    events += launch("fresh", 2, T0 + 4200, until=T0 + 5400, step0=101, restore=True)
    # A job that hangs: its launch's last step came before the window.
    events += launch("hung", 1, T0, until=T0 + 500)
    events.append(
        {"id": "hb", "job": "hung", "kind": "heartbeat", "ts": T0 + 5000, "node": "n01", "data": {}}
    )
    for i in range(0, len(events), 4000):
        assert ingest(events[i : i + 4000]).status_code in (200, 202)
    jobs = {j.key: j for j in TrainingJob.objects.all()}
    recent = jobs_recent_goodput(jobs=list(jobs.values()))

    steady = jobs["steady"]
    exact = job_ledger(steady, start=steady.last_event_ts - 3600)
    assert recent[steady.pk]["lower_bound"] is False
    assert recent[steady.pk]["goodput"] == pytest.approx(exact.goodput, rel=1e-9)
    assert 0.9 < exact.goodput < 1.0  # the saves' blocking is taken out

    fresh = jobs["fresh"]
    exact = job_ledger(fresh, start=fresh.last_event_ts - 3600)
    assert recent[fresh.pk]["lower_bound"] is True
    assert recent[fresh.pk]["goodput"] <= exact.goodput + 1e-9
    assert recent[fresh.pk]["goodput"] > 0.2

    hung = jobs["hung"]
    exact = job_ledger(hung, start=hung.last_event_ts - 3600)
    assert recent[hung.pk] == {
        "goodput": pytest.approx(exact.goodput),
        "lower_bound": False,
        "start": hung.last_event_ts - 3600,
        "end": hung.last_event_ts,
    }
    assert exact.goodput == 0.0


# --- cost ----------------------------------------------------------------------------


def _queries(client) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get("/").status_code == 200
    return len(ctx.captured_queries)


def test_the_query_count_does_not_grow_with_nodes_jobs_incidents(
    client, personas, django_assert_max_num_queries
):
    client.force_login(personas["viewer"].user)
    seed(1, 5, 2, 2, 2)
    few = _queries(client)
    seed(3, 300, 40, 60, 20, prefix="big")
    many = _queries(client)
    assert many == few
    with django_assert_max_num_queries(18):
        assert client.get("/").status_code == 200


def test_a_restart_inside_the_hour_gets_the_exact_figure_or_says_why_not(
    client, personas, ingest, monkeypatch
):
    from console.pages import overview

    # Its second launch began 20 minutes before its last event: the current launch
    # alone does not cover the hour.
    events = launch("fresh", 1, T0, until=T0 + 4000, saves={100: 4.0}, end=T0 + 4100)
    events += launch("fresh", 2, T0 + 4200, until=T0 + 5400, step0=101, restore=True)
    assert ingest(events).status_code in (200, 202)
    fresh = TrainingJob.objects.get(key="fresh")
    exact = job_ledger(fresh, start=fresh.last_event_ts - 3600).goodput
    client.force_login(personas["viewer"].user)

    def last_hour_cell() -> str:
        html = client.get("/").content.decode()
        row = re.search(r"<tr>\s*<td><a href=\"/jobs/fresh/\">.*?</tr>", html, re.S).group(0)
        return re.findall(r"<td class=\"num\".*?</td>", row, re.S)[-1]

    cell = last_hour_cell()
    assert f">{round(100 * exact)}%" in cell and "≥" not in cell
    assert "restarted inside the hour" in cell  # said on the page, not only in a tooltip
    assert 'title="' in cell

    # Past what the page recomputes, the lower bound stays, and says what it leaves out.
    monkeypatch.setattr(overview, "EXACT_MAX", 0)
    cell = last_hour_cell()
    assert "≥" in cell and "restarted inside the hour" in cell
    assert "time before the current launch" in cell
