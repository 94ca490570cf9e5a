"""Each guardrail stops what it should, when proposed and right before running, and
names itself on the action; a person's approval overrides those that only stop
automatic actions."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Node
from recovery import services
from recovery.models import Action, ClusterRecoverySettings
from tests.factories import ActionFactory, AttemptFactory
from tests.recovery.conftest import make_incident

pytestmark = pytest.mark.django_db

S = Action.State


def auto(cluster, kind, **target):
    return services.action_propose(
        cluster=cluster,
        kind=kind,
        reason="test",
        requested_by="policy:test",
        mode="auto",
        **target,
    )


def settings_of(cluster, **values) -> ClusterRecoverySettings:
    cfg, _ = ClusterRecoverySettings.objects.get_or_create(cluster=cluster)
    for k, v in values.items():
        setattr(cfg, k, v)
    cfg.save()
    return cfg


def test_nothing_blocks_an_automatic_action_on_a_quiet_cluster(cluster, nodes, job):
    action = auto(cluster, "cordon_node", node=nodes["n01"])
    assert (action.state, action.blocked_by) == (S.QUEUED, "")


def test_pause_sends_automatic_actions_to_approval_and_holds_queued_ones(cluster, nodes, job):
    queued = auto(cluster, "cordon_node", node=nodes["n01"])
    settings_of(cluster, paused=True, pause_reason="driver upgrade", paused_by="alice")
    action = auto(cluster, "restart_job", job=job)
    assert (action.state, action.blocked_by) == (S.AWAITING_APPROVAL, "pause")
    assert "driver upgrade" in action.blocked_reason and "alice" in action.blocked_reason
    # The one queued before the pause does not start.
    assert services.action_execute(action_id=queued.pk).what == "held"
    queued.refresh_from_db()
    assert (queued.state, queued.blocked_by) == (S.QUEUED, "pause")


def test_storm_names_itself(cluster, nodes, job):
    # 12 nodes: at most one automatic isolation (10%, at least one).
    Node.objects.filter(name="n03").update(
        state=Node.State.SUSPECT, state_changed_at=timezone.now()
    )
    action = auto(cluster, "cordon_node", node=nodes["n01"])
    assert (action.state, action.blocked_by) == (S.AWAITING_APPROVAL, "storm")
    assert action.blocked_reason.startswith("storm: 2 of 12 nodes")


def test_storm_counts_only_the_sliding_window(cluster, nodes, job):
    long_ago = timezone.now() - timedelta(hours=2)
    Node.objects.filter(name="n03").update(state=Node.State.IN_REPAIR, state_changed_at=long_ago)
    assert auto(cluster, "cordon_node", node=nodes["n01"]).state == S.QUEUED


def test_storm_leaves_actions_that_isolate_nothing_alone(cluster, nodes, job):
    Node.objects.filter(name__in=["n03", "n04", "n05"]).update(
        state=Node.State.SUSPECT, state_changed_at=timezone.now()
    )
    assert auto(cluster, "restart_job", job=job).state == S.QUEUED


def test_cooldown_after_a_failed_action_on_the_same_target(cluster, nodes, job):
    failed = ActionFactory(
        cluster=cluster,
        kind="restart_job",
        job=job,
        state=S.FAILED,
        requested_by="policy:crash",
        finished_at=timezone.now() - timedelta(seconds=60),
    )
    action = auto(cluster, "restart_job", job=job)
    assert (action.state, action.blocked_by) == (S.AWAITING_APPROVAL, "cooldown")
    assert f"#{failed.pk}" in action.blocked_reason
    # Past the cool-down, automatic again.
    Action.objects.filter(pk=failed.pk).update(finished_at=timezone.now() - timedelta(hours=1))
    services.action_cancel(action=action, actor="operator")
    assert auto(cluster, "restart_job", job=job).state == S.QUEUED


def test_a_crash_loop_turns_automatic_restarts_into_approvals(cluster, nodes, job):
    make_incident(job, cause="software", fault_type="crash_loop", detector="crash_loop")
    action = auto(cluster, "restart_job", job=job)
    assert (action.state, action.blocked_by) == (S.AWAITING_APPROVAL, "crash_loop")


def test_spares_block_a_replacement_when_none_is_free(cluster, nodes, job):
    Node.objects.filter(name__in=["s1", "s2"]).update(state=Node.State.RETIRED)
    action = auto(cluster, "replace_node", job=job, node=nodes["n01"])
    assert (action.state, action.blocked_by) == (S.AWAITING_APPROVAL, "spares")
    # An approval cannot make a spare appear: refused, naming the guardrail.
    with pytest.raises(services.Refused) as exc:
        services.action_approve(action=action, actor="operator2")
    assert (exc.value.code, exc.value.extra["guardrail"]) == ("guardrail", "spares")


def test_spares_promised_to_other_replacements_are_not_free(cluster, nodes, job):
    from tests.recovery.conftest import make_job

    settings_of(cluster, storm_max_share=1.0)  # no storm here: spares only
    other = make_job(cluster, nodes, key="other", on=("n03", "n04"))
    third = make_job(cluster, nodes, key="third", on=("n05", "n06"))
    assert auto(cluster, "replace_node", job=job, node=nodes["n01"]).state == S.QUEUED
    assert auto(cluster, "replace_node", job=other, node=nodes["n03"]).state == S.QUEUED
    blocked = auto(cluster, "replace_node", job=third, node=nodes["n05"])
    assert (blocked.state, blocked.blocked_by) == (S.AWAITING_APPROVAL, "spares")
    assert "2 spare, 2 promised" in blocked.blocked_reason


def test_guardrails_are_checked_again_right_before_running(cluster, nodes, job):
    action = auto(cluster, "cordon_node", node=nodes["n01"])
    assert action.state == S.QUEUED
    # Meanwhile other nodes fail: the storm guardrail stops it before it runs.
    Node.objects.filter(name__in=["n05", "n06"]).update(
        state=Node.State.SUSPECT, state_changed_at=timezone.now()
    )
    assert services.action_execute(action_id=action.pk).what == "returned"
    action.refresh_from_db()
    assert (action.state, action.blocked_by) == (S.AWAITING_APPROVAL, "storm")
    assert action.audit.last().actor == "rebound:guardrail"


def test_an_approval_overrides_the_automatic_guardrails(cluster, nodes, job, noop):
    Node.objects.filter(name__in=["n05", "n06"]).update(
        state=Node.State.SUSPECT, state_changed_at=timezone.now()
    )
    action = auto(cluster, "cordon_node", node=nodes["n01"])
    assert action.blocked_by == "storm"
    services.action_approve(action=action, actor="operator2", comment="it is really broken")
    assert services.action_execute(action_id=action.pk).what == "succeeded"
    assert [c["op"] for c in noop.calls] == ["cordon"]


def test_a_stale_approval_returns_to_the_queue(cluster, nodes, job):
    action = services.action_propose(
        cluster=cluster, kind="restart_job", job=job, reason="r", requested_by="operator"
    )
    assert action.target_snapshot == {"job_attempt": 1}
    # The job was relaunched by someone else since, and that launch stopped too (had
    # it been running, the restart would have nothing left to do: moved_on).
    AttemptFactory(job=job, number=2, world_size=16)
    job.status = job.Status.INTERRUPTED
    job.save()
    with pytest.raises(services.Refused) as exc:
        services.action_approve(action=action, actor="operator2")
    assert exc.value.code == "stale"
    action.refresh_from_db()
    assert (action.state, action.blocked_by, action.approved_by) == (
        S.AWAITING_APPROVAL,
        "stale",
        "",
    )
    assert action.target_snapshot == {"job_attempt": 2}
    assert [(a.from_state, a.to_state) for a in action.audit.all()][-2:] == [
        (S.AWAITING_APPROVAL, S.APPROVED),
        (S.APPROVED, S.AWAITING_APPROVAL),
    ]
    assert "job launch 1 -> 2" in action.audit.last().reason
    # Approved again on the state as it is now: it goes.
    services.action_approve(action=action, actor="operator2")
    action.refresh_from_db()
    assert action.state == S.QUEUED


def test_a_target_that_changed_while_queued_goes_back_for_approval(cluster, nodes, job):
    action = auto(cluster, "cordon_node", node=nodes["n01"])
    Node.objects.filter(pk=nodes["n01"].pk).update(state=Node.State.SUSPECT)
    assert services.action_execute(action_id=action.pk).what == "returned"
    action.refresh_from_db()
    assert (action.state, action.blocked_by) == (S.AWAITING_APPROVAL, "stale")
    assert "node state active -> suspect" in action.blocked_reason


def test_a_queued_action_whose_node_got_there_meanwhile_is_cancelled(cluster, nodes, job, noop):
    action = auto(cluster, "cordon_node", node=nodes["n01"])
    Node.objects.filter(pk=nodes["n01"].pk).update(state=Node.State.IN_REPAIR)
    assert services.action_execute(action_id=action.pk).what == "cancelled"
    action.refresh_from_db()
    assert action.state == S.CANCELLED and noop.calls == []
    assert "moved_on: node n01 is in_repair already" in action.audit.last().reason


def test_dry_run_records_what_would_be_done_and_does_nothing(cluster, nodes, job, noop):
    settings_of(cluster, dry_run=True, driver="local", driver_options={"root": "/nonexistent"})
    action = auto(cluster, "cordon_node", node=nodes["n01"])
    assert action.dry_run
    assert services.action_execute(action_id=action.pk).what == "succeeded"
    action.refresh_from_db()
    assert action.output == {
        "dry_run": True,
        "would": {"op": "cordon", "node": "n01", "key": f"rebound:action-{action.pk}"},
    }
    nodes["n01"].refresh_from_db()
    assert nodes["n01"].state == Node.State.ACTIVE  # nothing changed
