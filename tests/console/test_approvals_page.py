"""The approval queue page: the evidence of each waiting action, the two-person rule
shown and enforced, the decision forms (JSON and plain), who may post them, and a
number of queries that does not grow with the queue."""

import re

import pytest
from django.test import Client
from django.utils import timezone

from incidents.models import TimelineEntry
from jobs.models import Cluster, Node
from recovery import selectors, services
from recovery.models import Action, ClusterRecoverySettings
from tests.factories import (
    ActionFactory,
    ClusterFactory,
    ClusterRecoverySettingsFactory,
    NodeFactory,
    RankWindowFactory,
    TimelineEntryFactory,
    UserFactory,
)
from tests.recovery.conftest import T0, dt, make_incident, make_job

pytestmark = pytest.mark.django_db

S = Action.State
URL = "/approvals/"
OWN = "you requested this; another operator must approve"
JSON = {"HTTP_ACCEPT": "application/json"}


@pytest.fixture
def cluster(db):
    return ClusterFactory(name="east")


@pytest.fixture
def nodes(cluster):
    """n01..n10 active, s1 and s2 spare."""
    out = {}
    for i in range(1, 11):
        out[f"n{i:02d}"] = NodeFactory(cluster=cluster, name=f"n{i:02d}")
    for name in ("s1", "s2"):
        out[name] = NodeFactory(cluster=cluster, name=name, state=Node.State.SPARE)
    return out


@pytest.fixture
def job(cluster, nodes):
    """llm: running on n01, n02 (16 GPUs) at step 100, its checkpoint of step 80
    saved 200 s before its last step."""
    return make_job(cluster, nodes)


@pytest.fixture
def operator2(personas):
    return UserFactory(username="operator2", role="operator")


def propose(personas, kind="replace_node", who="operator", **fields):
    fields.setdefault("cluster", Cluster.objects.get(name="east"))
    user = personas[who].user
    return services.action_propose(
        kind=kind,
        reason=fields.pop("reason", f"{kind} please"),
        requested_by=user.username,
        requested_by_user=user,
        **fields,
    )


@pytest.fixture
def waiting(personas, nodes, job):
    """operator asks to replace n02 of llm, for an incident with a signal."""
    incident = make_incident(job, cause="gpu", fault_type="gpu_xid", nodes=[nodes["n02"]])
    incident.ranks = [8, 9]
    incident.save()
    TimelineEntryFactory(
        incident=incident,
        kind=TimelineEntry.Kind.SIGNAL,
        at=dt(T0 + 990),
        actor="job",
        message="Xid 79 on n02: GPU has fallen off the bus",
    )
    return propose(personas, node=nodes["n02"], job=job, incident=incident, reason="n02 is gone")


def page(client, user) -> str:
    client.force_login(user)
    r = client.get(URL)
    assert r.status_code == 200
    return r.content.decode()


def decide(client, user, action, decision, comment="", json=True):
    client.force_login(user)
    extra = JSON if json else {}
    data = {"decision": decision, "comment": comment}
    return client.post(f"/approvals/{action.pk}/decide", data, **extra)


# --- the page ------------------------------------------------------------------------


def test_the_queue_shows_each_action_with_its_evidence(client, personas, waiting, operator2):
    html = page(client, operator2)
    a, i = waiting, waiting.incident
    assert "showing 1 of 1" in html
    assert f'data-live-action="{a.pk}"' in html and "awaiting approval" in html
    assert 'data-action-row data-state="awaiting_approval"' in html
    assert f'href="/incidents/{i.pk}/"' in html and "gpu / gpu_xid" in html
    assert "Xid 79 on n02: GPU has fallen off the bus" in html  # its signal
    assert "8, 9" in html  # the incident's ranks
    assert 'href="/jobs/llm/"' in html and "launch 1 on 2 nodes (n01, n02)" in html
    assert "<b>all 16</b> (0\N{EN DASH}15) of llm" in html  # the ranks that restart
    # 200 s since the checkpoint of step 80, x 16 GPUs.
    assert "<b>0.889 GPU-hours</b> · 20 steps · 200 s since the checkpoint" in html
    assert "back to step 80 from 100" in html
    assert "0 of 12 (0%) · storm limit 10%, at most 10 nodes (1 node)" in html
    assert "2 (2 free spares, 0 promised)" in html  # the spare pool left
    assert "Requested by <b>operator</b>" in html and "expires" in html
    assert "n02 is gone" in html
    assert 'data-poll-s="3"' in html


def test_a_blocked_action_names_its_guardrail_and_the_cluster_pause_shows(
    client, personas, nodes, job, operator2
):
    ClusterRecoverySettingsFactory(
        cluster=job.cluster, paused=True, pause_reason="maintenance", paused_by="admin"
    )
    for n in ("n03", "n04"):
        nodes[n].state = Node.State.SUSPECT
        nodes[n].save()
    action = propose(personas, node=nodes["n01"], job=job)
    Action.objects.filter(pk=action.pk).update(blocked_by="storm", blocked_reason="storm: 3 of 12")
    html = page(client, operator2)
    assert "Blocked by guardrail <code>storm</code></b>: storm: 3 of 12" in html
    assert "paused</b> by admin: maintenance" in html
    assert "2 of 12 (17%) · storm limit 10%, at most 10 nodes (1 node): over it" in html


def test_the_requester_sees_approve_disabled_with_the_reason(client, personas, waiting, operator2):
    html = page(client, personas["operator"].user)
    assert re.search(r'<input type="submit" class="approve" value="Approve" disabled', html)
    assert "You requested this; another operator must approve." in html
    assert 'value="approve"' not in html  # no enabled Approve button
    assert 'name="decision" value="reject"' in html  # rejecting one's own is allowed
    html = page(client, operator2)
    assert 'name="decision" value="approve">Approve</button>' in html
    assert OWN not in html.lower()


def test_a_viewer_sees_the_queue_and_no_buttons(client, personas, waiting):
    html = page(client, personas["viewer"].user)
    assert f'data-live-action="{waiting.pk}"' in html and "0.889 GPU-hours" in html
    assert '<form class="decision"' not in html and "Approve" not in html
    assert "Reject" not in html and "viewer role" in html


def test_the_queue_is_capped_oldest_first(client, personas, nodes, job, operator2):
    first = propose(personas, kind="cordon_node", node=nodes["n05"], reason="the oldest")
    for i in range(29):
        propose(personas, kind="validate_node", node=nodes[f"n{i % 10 + 1:02d}"])
    html = page(client, operator2)
    assert "showing 25 of 30" in html
    assert re.search(r'id="action-(\d+)"', html).group(1) == str(first.pk)
    assert html.count('data-action-row data-state="awaiting_approval"') == 25


# --- the decisions -------------------------------------------------------------------


def test_a_second_operator_approves_in_place(client, personas, waiting, operator2):
    r = decide(client, operator2, waiting, "approve", "go")
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["ok"], body["state"], body["action"]) == (True, "queued", waiting.pk)
    assert "queued" in body["detail"]
    waiting.refresh_from_db()
    assert (waiting.state, waiting.approved_by, waiting.comment) == (S.QUEUED, "operator2", "go")
    # It left the queue: it is now among the decided, its state live.
    html = page(client, operator2)
    assert "Nothing waits for a decision." in html
    decided = html[html.index("Recently decided") :]
    assert f'data-live-action="{waiting.pk}" data-state="queued"' in decided
    assert "<td>approved</td><td>operator2</td>" in decided


def test_the_plain_form_approves_and_redirects_back(client, personas, waiting, operator2):
    r = decide(client, operator2, waiting, "approve", json=False)
    assert r.status_code == 302 and r["Location"] == URL
    waiting.refresh_from_db()
    assert waiting.state == S.QUEUED
    html = client.get(URL).content.decode()
    assert f"Approved: action #{waiting.pk} is queued." in html  # the message


def test_ones_own_approval_is_refused_by_the_server(client, personas, waiting):
    r = decide(client, personas["operator"].user, waiting, "approve")
    assert r.status_code == 403
    body = r.json()
    assert (body["ok"], body["error"], body["state"]) == (False, "own_action", "awaiting_approval")
    assert "another operator must approve" in body["detail"]
    waiting.refresh_from_db()
    assert (waiting.state, waiting.approved_by) == (S.AWAITING_APPROVAL, "")
    assert waiting.audit.count() == 2


def test_reject_needs_a_comment(client, personas, waiting, operator2):
    r = decide(client, operator2, waiting, "reject", "   ")
    assert r.status_code == 400
    assert r.json() == {
        "ok": False,
        "detail": "Say why you reject it: a comment is required.",
        "error": "invalid",
        "field": "comment",
    }
    waiting.refresh_from_db()
    assert waiting.state == S.AWAITING_APPROVAL
    r = decide(client, operator2, waiting, "reject", "the node came back")
    assert r.status_code == 200 and r.json()["state"] == "rejected"
    waiting.refresh_from_db()
    assert (waiting.state, waiting.comment) == (S.REJECTED, "the node came back")
    # Decided, it cannot be decided again.
    r = decide(client, operator2, waiting, "approve")
    assert r.status_code == 409 and r.json()["error"] == "invalid_state"


@pytest.mark.parametrize("decision", ["approve", "reject", "maybe"])
def test_a_comment_longer_than_the_apis_limit_is_refused(client, waiting, operator2, decision):
    """The page checks a decision's body with the API's validator (its limit, 2000)."""
    r = decide(client, operator2, waiting, decision, "x" * 2001)
    assert (r.status_code, r.json()) == (
        400,
        {
            "ok": False,
            "detail": "The comment is too long (at most 2000 characters).",
            "error": "invalid",
        },
    )
    r = decide(client, operator2, waiting, "maybe", "x" * 2000)
    assert (r.status_code, r.json()) == (
        400,
        {"ok": False, "detail": "Choose Approve or Reject.", "error": "invalid"},
    )
    waiting.refresh_from_db()
    assert waiting.state == S.AWAITING_APPROVAL
    r = decide(client, operator2, waiting, "reject", "  " + "x" * 2000 + "  ")  # trimmed
    assert r.status_code == 200 and r.json()["state"] == "rejected"
    waiting.refresh_from_db()
    assert waiting.comment == "x" * 2000


def test_a_guardrail_refusal_is_a_clear_answer(client, personas, waiting, operator2, nodes, job):
    holder = ActionFactory(
        kind="restart_job", state=S.QUEUED, cluster=job.cluster, job=job, requested_by="x"
    )
    r = decide(client, operator2, waiting, "approve")
    assert r.status_code == 409
    body = r.json()
    assert (body["error"], body["guardrail"]) == ("guardrail", "lease")
    assert f"action #{holder.pk}" in body["detail"]
    waiting.refresh_from_db()
    assert waiting.state == S.AWAITING_APPROVAL


def test_a_stale_approval_is_refused_and_the_action_waits_again(
    client, personas, waiting, operator2, nodes
):
    Node.objects.filter(pk=nodes["n02"].pk).update(state=Node.State.SUSPECT)
    r = decide(client, operator2, waiting, "approve")
    assert r.status_code == 409
    body = r.json()
    assert (body["error"], body["state"], body["action"]) == (
        "stale",
        "awaiting_approval",
        waiting.pk,
    )
    assert "back in the approval queue" in body["detail"]
    html = page(client, operator2)
    queue, decided = html.split("Recently decided")
    assert f'id="action-{waiting.pk}"' in queue
    assert "Blocked by guardrail <code>stale</code>" in queue
    assert f'data-live-action="{waiting.pk}"' not in decided  # it is waiting, not decided


@pytest.mark.parametrize("who", ["viewer", "outsider"])
def test_viewers_and_outsiders_may_not_decide(client, personas, waiting, who):
    for decision in ("approve", "reject"):
        r = decide(client, personas[who].user, waiting, decision, "no")
        assert r.status_code == 403, (who, decision)
    waiting.refresh_from_db()
    assert waiting.state == S.AWAITING_APPROVAL and waiting.audit.count() == 2


def test_strangers_are_sent_to_sign_in(client, waiting):
    assert client.get(URL).status_code == 302
    r = client.post(f"/approvals/{waiting.pk}/decide", {"decision": "approve"})
    assert r.status_code == 302 and "/login/" in r["Location"]
    waiting.refresh_from_db()
    assert waiting.state == S.AWAITING_APPROVAL


def test_decisions_are_post_only_and_unknown_actions_404(client, personas, operator2):
    client.force_login(operator2)
    assert client.get("/approvals/1/decide").status_code == 405
    r = client.post("/approvals/4242/decide", {"decision": "approve"}, **JSON)
    assert r.status_code == 404 and r.json()["error"] == "not_found"


def test_csrf_is_enforced(personas, waiting, operator2):
    c = Client(enforce_csrf_checks=True)
    c.force_login(operator2)
    url = f"/approvals/{waiting.pk}/decide"
    assert c.post(url, {"decision": "approve"}, **JSON).status_code == 403
    waiting.refresh_from_db()
    assert waiting.state == S.AWAITING_APPROVAL
    html = c.get(URL).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)
    r = c.post(url, {"decision": "approve", "csrfmiddlewaretoken": token}, **JSON)
    assert r.status_code == 200 and r.json()["state"] == "queued"


# --- the batched evidence and the query count ----------------------------------------


def variety(personas, cluster, nodes, tag: str) -> list[Action]:
    """One action of each kind with evidence to read: its own job and incident, a job
    on a drained node, a scale-down naming nodes, a rollback to a checkpoint."""
    on = (f"n{len(tag) % 5 * 2 + 1:02d}", f"n{len(tag) % 5 * 2 + 2:02d}")
    job = make_job(cluster, nodes, key=f"job-{tag}", on=on)
    incident = make_incident(job, nodes=[nodes[on[0]]])
    TimelineEntryFactory(
        incident=incident, kind="signal", at=dt(T0), actor="job", message=f"crash {tag}"
    )
    n0, n1 = nodes[on[0]], nodes[on[1]]
    return [
        propose(personas, kind="restart_job", job=job, incident=incident),
        propose(personas, kind="rollback", job=job, params={"step": 80}),
        propose(personas, kind="replace_node", job=job, node=n1, incident=incident),
        propose(personas, kind="drain_node", node=n0),
        propose(personas, kind="cordon_node", node=n1),
        propose(personas, kind="scale_down", job=job, params={"nodes": [n1.name]}),
        propose(personas, kind="validate_node", node=nodes["n10"]),
    ]


def test_the_batched_evidence_matches_action_evidence(personas, cluster, nodes):
    actions = variety(personas, cluster, nodes, "a")
    items = {i["action"].pk: i for i in selectors.approval_queue()["items"]}
    assert len(items) == len(actions)
    for action in actions:
        item, want = items[action.pk], selectors.action_evidence(action)
        assert [n.name for n in item["nodes"]] == [n["name"] for n in want["nodes"]], action
        assert [r["job"].key for r in item["jobs"]] == [j["key"] for j in want["jobs"]], action
        assert item["gpu_hours"] == want["gpu_hours_at_stake"], action
        assert item["restarts"] == (want["restarts_jobs"] and bool(want["jobs"])), action
        if want["incident"]:
            assert item["incident_nodes"] == want["incident"]["nodes"]
    # The kinds that relaunch the job put its progress since the checkpoint at stake.
    restart = items[actions[0].pk]
    assert restart["gpu_hours"] == pytest.approx(200 * 16 / 3600, abs=1e-6)
    assert restart["steps_lost"] == 20 and restart["ranks_restarting"] == 16
    assert [s.message for s in restart["signals"]] == ["crash a"]
    drain = items[actions[3].pk]
    assert [r["job"].key for r in drain["jobs"]] == ["job-a"]  # the job on the drained node
    assert items[actions[4].pk]["gpu_hours"] == 0.0  # a cordon relaunches nothing


def decide_some(personas, actions):
    for action in actions[:3]:
        services.action_reject(action=action, actor="admin", comment="not now")


def test_the_query_count_does_not_grow_with_the_queue(
    client, personas, cluster, nodes, operator2, django_assert_max_num_queries
):
    decide_some(personas, variety(personas, cluster, nodes, "a"))
    client.force_login(operator2)
    with django_assert_max_num_queries(32) as few:
        assert client.get(URL).status_code == 200
    for i in range(7):  # 28 more waiting, over the page's cap, and more decided
        decide_some(personas, variety(personas, cluster, nodes, f"b{i}"))
    assert Action.objects.filter(state=S.AWAITING_APPROVAL).count() > 25
    with django_assert_max_num_queries(32) as many:
        html = client.get(URL).content.decode()
    assert "showing 25 of " in html
    # The count of waiting actions is the one query a full page adds.
    assert len(many.captured_queries) <= len(few.captured_queries) + 1


def test_an_expired_approval_is_listed_as_decided(client, personas, waiting, operator2):
    Action.objects.filter(pk=waiting.pk).update(expires_at=timezone.now())
    assert services.approvals_expire() == [waiting.pk]
    html = page(client, operator2)
    decided = html[html.index("Recently decided") :]
    assert "<td>expired</td><td>rebound:expiry</td>" in decided


# --- guardrails checked before Approve is offered -------------------------------------


def approve_control(html: str, action) -> str:
    """The card's Approve control (a button, or a disabled input) and what follows it."""
    card = html[html.index(f'id="action-{action.pk}"') :]
    card = card[: card.index("</article>")]
    return card[card.rindex("<", 0, card.index('class="approve"')) :]


def test_a_replacement_with_no_spare_left_is_not_offered(client, personas, waiting, operator2):
    Node.objects.filter(state=Node.State.SPARE).update(state=Node.State.ACTIVE)
    html = page(client, operator2)
    control = approve_control(html, waiting)
    assert control.startswith('<input type="submit" class="approve" value="Approve" disabled')
    assert "Blocked by spares: spares: no spare node free on this cluster" in control
    assert "Cannot be approved now: <code>spares</code>" in html
    assert 'Blocked by</dt><dd><b class="warn"><code>spares</code></b>' in html
    # The server gives the same answer, from the same function.
    r = decide(client, operator2, waiting, "approve")
    assert r.status_code == 409
    assert (r.json()["error"], r.json()["guardrail"]) == ("guardrail", "spares")
    waiting.refresh_from_db()
    assert waiting.state == S.AWAITING_APPROVAL  # it waits for a spare


def test_the_demos_straggler_after_its_job_completed(client, personas, nodes, job, operator2):
    """The replacement at the next checkpoint still waits after the job completed and
    the only spare was used: Approve is not offered, the card says why, and the
    expiry task retires it with a timeline entry."""
    from jobs.models import TrainingJob
    from recovery import tasks

    incident = make_incident(
        job, cause="straggler", fault_type="straggler", nodes=[nodes["n02"]], attempt=None
    )
    action = services.action_propose(
        cluster=job.cluster,
        kind="replace_at_next_checkpoint",
        node=nodes["n02"],
        job=job,
        incident=incident,
        reason="straggler",
        requested_by="policy:straggler",
        policy="straggler/replace_at_next_checkpoint (default)",
    )
    TrainingJob.objects.filter(pk=job.pk).update(status=TrainingJob.Status.COMPLETED)
    Node.objects.filter(state=Node.State.SPARE).update(state=Node.State.ACTIVE)
    html = page(client, operator2)
    control = approve_control(html, action)
    assert 'class="approve" value="Approve" disabled' in control
    assert "Blocked by moved_on: moved_on: job llm finished (completed)" in control
    assert "Blocked by</dt><dd>none" not in html
    assert 'Ranks restarting</dt><dd class="ranks">none: the job has finished' in html
    tasks.approvals_retire()
    action.refresh_from_db()
    assert action.state == S.CANCELLED
    assert TimelineEntry.objects.filter(
        incident=incident, message__contains="cancelled: moved_on: job llm finished"
    ).exists()
    assert "Nothing waits for a decision." in page(client, operator2)


def test_the_blast_radius_of_a_replacement_says_what_restarts(
    client, personas, nodes, job, operator2
):
    for rank in range(16):
        RankWindowFactory(
            job=job,
            attempt=1,
            rank=rank,
            node=nodes["n01"] if rank < 8 else nodes["n02"],
            first_step=90,
            last_step=99,
            ts=T0 + 990,
            compute_s=1.0,
            step_s=1.0,
        )
    at_checkpoint = propose(personas, kind="replace_at_next_checkpoint", node=nodes["n02"], job=job)
    html = page(client, operator2)
    card = html[html.index(f'id="action-{at_checkpoint.pk}"') :]
    assert (
        "<b>all 16</b> (0\N{EN DASH}15) of llm: the whole job relaunches at its next durable"
        " checkpoint with a spare in place of n02; its ranks on n02: 8\N{EN DASH}15"
    ) in card
    assert "<b>little</b>: it waits for a durable checkpoint after step 80" in card
    assert "now <b>0.889 GPU-hours</b> · 20 steps · 200 s since the checkpoint" in card
    services.action_cancel(action=at_checkpoint, actor="operator")
    now = propose(personas, kind="replace_node", node=nodes["n02"], job=job)
    card = page(client, operator2)
    card = card[card.index(f'id="action-{now.pk}"') :]
    assert "the whole job relaunches with a spare in place of n02; its ranks on n02: 8" in card
    assert "<b>0.889 GPU-hours</b> · 20 steps · 200 s since the checkpoint" in card


def test_the_storm_state_counts_the_nodes_the_cluster_has(client, personas, waiting, operator2):
    # Names an ingest batch made up: never heard from, not registered.
    Node.objects.bulk_create(
        [Node(cluster=waiting.cluster, name=f"ghost{i}", registered=False) for i in range(200)]
    )
    ClusterRecoverySettings.objects.filter(cluster=waiting.cluster).update(storm_max_nodes=4)
    html = page(client, operator2)
    assert "0 of 12 (0%) · storm limit 10%, at most 4 nodes (1 node)" in html
    assert "of the nodes registered or heard from within 60 min" in html
