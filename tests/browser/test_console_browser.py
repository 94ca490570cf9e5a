"""The console in a real browser: sign in, the overview's node grid, the job page's
charts drawn with data, and the approval queue's two-person rule, with a decision
posted in place and its state followed live (no reload) while a real Celery worker
carries the action out through the `noop` driver.

Each test ends by writing its screenshot (1440x900); with REBOUND_SCREENSHOTS=1 they go
under docs/img/, for the README (otherwise to a temporary directory): a failing test
writes none."""

import time
from datetime import UTC, datetime

import pytest
from django.core.management import call_command

from incidents.models import Incident, TimelineEntry
from jobs.models import Attempt, Checkpoint, Cluster, Node, TrainingJob
from recovery import services
from recovery.models import Action, ClusterRecoverySettings
from tests.browser.conftest import save_shot

pytestmark = [pytest.mark.engine_free, pytest.mark.django_db(transaction=True)]

S = Action.State
DONE_S = 60  # the worker's run, seen through the page's 3 s poll


def at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def seed_cluster() -> dict[str, Node]:
    """Cluster `east`: n01..n32 (n05 suspect, n17 cordoned), spares s1..s3, driven by
    the noop driver."""
    east = Cluster.objects.create(name="east")
    ClusterRecoverySettings.objects.create(cluster=east, driver="noop")
    nodes = {}
    for i in range(1, 33):
        name = f"n{i:02d}"
        state = {5: Node.State.SUSPECT, 17: Node.State.CORDONED}.get(i, Node.State.ACTIVE)
        nodes[name] = Node.objects.create(cluster=east, name=name, gpus=8, state=state)
    for name in ("s1", "s2", "s3"):
        nodes[name] = Node.objects.create(cluster=east, name=name, gpus=8, state=Node.State.SPARE)
    return nodes


def seed_job(nodes: dict[str, Node]) -> tuple[TrainingJob, Incident]:
    """llm-70b: running on n01..n08 (64 GPUs) since an hour ago, at step 4,200 half a
    minute ago (received a second later); its last durable checkpoint (step 4,000) was
    saved 12 minutes ago. An Xid 79 incident on n05."""
    now = time.time()
    east = nodes["n01"].cluster
    job = TrainingJob.objects.create(
        key="llm-70b",
        cluster=east,
        status=TrainingJob.Status.RUNNING,
        first_event_ts=now - 3600,
        last_event_ts=now - 30,
        last_step=4200,
        last_step_ts=now - 30,
        last_received_at=at(now - 29),
    )
    attempt = Attempt.objects.create(
        job=job, number=1, world_size=64, gpus_per_node=8, started_at=at(now - 3600)
    )
    attempt.nodes.set([nodes[f"n{i:02d}"] for i in range(1, 9)])
    Checkpoint.objects.create(
        job=job, attempt=1, step=4000, saved_at=at(now - 720), durable=True, tier="remote"
    )
    incident = Incident.objects.create(
        job=job,
        cluster=east,
        detector="launch_fault",
        episode="xid-n05",
        attempt=1,
        cause="gpu",
        fault_type="gpu_xid",
        xid=79,
        severity="critical",
        summary="Xid 79 on n05: GPU has fallen off the bus",
        fault_at=at(now - 40),
        detected_at=at(now - 38),
        ranks=[32, 33, 34, 35, 36, 37, 38, 39],
    )
    incident.nodes.set([nodes["n05"]])
    TimelineEntry.objects.create(
        incident=incident,
        kind=TimelineEntry.Kind.SIGNAL,
        at=at(now - 40),
        actor="llm-70b",
        source="rank 35",
        message="fault gpu_xid on n05 (rank 35): Xid 79, GPU has fallen off the bus",
    )
    return job, incident


def state_of(pk: int) -> str:
    return Action.objects.values_list("state", flat=True).get(pk=pk)


# --- (a) sign in, the overview ------------------------------------------------------


def test_an_operator_signs_in_and_sees_the_node_grid_live(tabs, accounts):
    nodes = seed_cluster()
    job, incident = seed_job(nodes)
    call_command("seed_demo", verbosity=0)
    tab = tabs()
    tab.login("alice")  # "/" sends a stranger to the sign-in form, then back
    page = tab.page
    assert page.url == tab.base + "/"
    page.wait_for_selector("[data-live-node]")
    shown = set(
        page.eval_on_selector_all("[data-live-node]", "els => els.map(e => e.dataset.liveNode)")
    )
    assert {str(n.pk) for n in Node.objects.all()} <= shown
    cell = f'[data-live-node="{nodes["n09"].pk}"]'
    assert page.get_attribute(cell, "data-state") == "active"
    # Another process changes a node: the grid follows without a reload.
    page.evaluate("window.__marker = 1")
    Node.objects.filter(pk=nodes["n09"].pk).update(state=Node.State.CORDONED)
    page.wait_for_function(
        f"document.querySelector('{cell}').dataset.state === 'cordoned'", timeout=20_000
    )
    assert page.evaluate("window.__marker") == 1
    # The node the open incident names is ringed, and keeps the incident in its title
    # after the live poll rewrote it.
    ringed = f'[data-live-node="{nodes["n05"].pk}"]'
    assert "incident" in page.get_attribute(ringed, "class").split()
    assert f"n05: suspect; open incident #{incident.pk} gpu (gpu_xid)" == page.get_attribute(
        ringed, "title"
    )
    tab.assert_clean()
    save_shot("overview.png", tab.screenshot())
    # The job goes quiet: its row turns silent, with the age, without a reload.
    heard = f'[data-live-job-heard="{job.pk}"]'
    assert page.inner_text(heard).endswith(" s ago")
    TrainingJob.objects.filter(pk=job.pk).update(last_received_at=at(time.time() - 600))
    page.wait_for_function(
        f"document.querySelector('{heard}').textContent.startsWith('silent')", timeout=20_000
    )
    assert page.inner_text(heard) == "silent 10 min"
    assert page.get_attribute(heard, "class") == "status status-silent"
    assert page.evaluate("window.__marker") == 1


# --- (b) a job page's charts ---------------------------------------------------------

CHARTS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(el => ({
  id: el.id,
  title: el.layout && el.layout.title && (el.layout.title.text || el.layout.title),
  drawn: !!el.querySelector('.main-svg'),
  points: (el.data || []).map(t => Math.max(
    (t.x || []).length, (t.y || []).length, (t.values || []).length, (t.z || []).length)),
}))"""


def test_the_job_page_draws_its_charts_with_data(tabs, accounts):
    call_command("seed_demo", verbosity=0)
    tab = tabs()
    tab.login("vera", "/jobs/demo-llm/")
    page = tab.page
    assert page.url.endswith("/jobs/demo-llm/")
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2")
    charts = page.evaluate(CHARTS)
    assert len(charts) >= 2, charts
    for chart in charts:
        assert chart["drawn"] and chart["title"], chart
        assert chart["points"] and max(chart["points"]) > 0, f"a chart without data: {chart}"
    tab.assert_clean()
    # The README's picture: the goodput, progress, loss and step-time charts.
    page.evaluate(
        "() => { const h = Array.from(document.querySelectorAll('h2'))"
        ".find(e => e.textContent.startsWith('Goodput over time'));"
        " if (h) window.scrollTo(0, h.getBoundingClientRect().top + window.scrollY - 10); }"
    )
    page.wait_for_timeout(300)
    save_shot("job.png", tab.screenshot())


# --- (c) the approval queue: two operators, a real worker ------------------------------


def test_a_second_operator_approves_in_place_and_the_worker_carries_it_out(tabs, accounts, console):
    nodes = seed_cluster()
    job, incident = seed_job(nodes)
    east = job.cluster
    action = services.action_propose(
        cluster=east,
        kind=Action.Kind.REPLACE_NODE,
        node=nodes["n05"],
        job=job,
        incident=incident,
        reason="Xid 79: n05 fell off the bus; swap in a spare and relaunch",
        requested_by="alice",
        requested_by_user=accounts["alice"],
    )
    waits = services.action_propose(
        cluster=east,
        kind=Action.Kind.DRAIN_NODE,
        node=nodes["n17"],
        reason="ECC errors on n17 three times this week",
        requested_by="policy:repeat_offender",
    )
    assert state_of(action.pk) == state_of(waits.pk) == S.AWAITING_APPROVAL
    row = f"#action-{action.pk}"

    # Alice asked for it: her Approve is disabled, with the reason beside it.
    alice = tabs()
    alice.login("alice", "/approvals/")
    approve = alice.page.locator(f"{row} .approve")
    assert approve.is_disabled()
    assert "another operator must approve" in alice.page.inner_text(f"{row} .own-reason")
    # Rejecting without a comment is refused in place; her Approve stays disabled.
    alice.page.click(f"{row} button.reject")
    result = alice.page.locator(f"{row} [data-async-result]")
    result.filter(has_text="comment is required").wait_for()
    assert approve.is_disabled() and state_of(action.pk) == S.AWAITING_APPROVAL

    # Bob approves it: the answer and then the worker's progress show in place.
    bob = tabs()
    bob.login("bob", "/approvals/")
    page = bob.page
    page.evaluate("window.__marker = 1")
    assert page.inner_text(f'[data-live-action="{action.pk}"]') == "awaiting approval"
    assert page.inner_text("[data-live=approvals]") == "2"
    shot = bob.screenshot()
    page.fill(f"#comment-{action.pk}", "n05 is gone; s1 takes over")
    page.click(f"{row} button.approve")
    page.locator(f"{row} [data-async-result]").filter(has_text="Approved").wait_for()
    page.wait_for_function(
        f"""['queued', 'running', 'succeeded'].includes(
              document.querySelector('[data-live-action="{action.pk}"]').dataset.state)"""
    )
    page.wait_for_function(
        f"""document.querySelector('[data-live-action="{action.pk}"]').dataset.state
              === 'succeeded'""",
        timeout=DONE_S * 1000,
    )
    assert page.inner_text(f'[data-live-action="{action.pk}"]') == "succeeded"
    assert page.evaluate("window.__marker") == 1  # the same page: no reload
    page.locator("[data-live=approvals]").filter(has_text="1").wait_for()  # the badge too
    assert page.locator(f"{row} button.approve").is_disabled()  # decided: no second click

    done = Action.objects.get(pk=action.pk)
    assert (done.state, done.approved_by, done.comment) == (
        S.SUCCEEDED,
        "bob",
        "n05 is gone; s1 takes over",
    )
    assert done.output.get("noop") is True  # the worker ran it through the noop driver
    assert state_of(waits.pk) == S.AWAITING_APPROVAL
    assert page.inner_text(f'[data-live-action="{waits.pk}"]') == "awaiting approval"
    alice.assert_clean()
    bob.assert_clean()
    save_shot("approvals.png", shot)


# --- (d) a viewer ---------------------------------------------------------------------


def test_a_viewer_sees_the_queue_and_no_buttons(tabs, accounts):
    nodes = seed_cluster()
    job, incident = seed_job(nodes)
    action = services.action_propose(
        cluster=job.cluster,
        kind=Action.Kind.RESTART_JOB,
        job=job,
        incident=incident,
        reason="relaunch from step 4000",
        requested_by="alice",
        requested_by_user=accounts["alice"],
    )
    tab = tabs()
    tab.login("vera", "/approvals/")
    page = tab.page
    card = page.locator(f"#action-{action.pk}")
    assert "GPU-hours" in card.inner_text() and "llm-70b" in card.inner_text()
    assert page.locator("form.decision").count() == 0
    assert page.locator(".approve, .reject, button[value=approve]").count() == 0
    assert "viewer role" in page.inner_text("main")
    tab.assert_clean()
