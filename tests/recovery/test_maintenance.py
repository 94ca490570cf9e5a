"""Recovery around planned maintenance: actions on nodes under maintenance are held
until the window is over, planned incidents propose nothing, and a window with a
pre-maintenance action proposes it once, its lead time before it starts."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from jobs import services as job_services
from jobs.models import MaintenanceWindow, TrainingJob
from recovery import guardrails, services, tasks
from recovery.models import Action, RecoveryPolicy
from tests.recovery.conftest import make_incident, make_job

pytestmark = pytest.mark.django_db

S = Action.State


def declare(cluster, start_in_s, length_s, nodes=(), **kw):
    now = timezone.now()
    return job_services.maintenance_window_create(
        cluster=cluster,
        starts_at=now + timedelta(seconds=start_in_s),
        ends_at=now + timedelta(seconds=start_in_s + length_s),
        nodes=list(nodes),
        reason="kernel upgrade",
        **kw,
    )


def auto(cluster, kind, **target):
    return services.action_propose(
        cluster=cluster, kind=kind, reason="test", requested_by="policy:test", mode="auto", **target
    )


def end_now(window):
    MaintenanceWindow.objects.filter(pk=window.pk).update(
        ends_at=timezone.now() - timedelta(seconds=1)
    )


def test_an_action_on_a_node_under_maintenance_is_held_and_runs_after(cluster, nodes, job):
    queued = auto(cluster, "cordon_node", node=nodes["n03"])
    assert queued.state == S.QUEUED
    window = declare(cluster, -600, 3600, ["n03", "n06"])
    # A new automatic one waits for approval, naming the window.
    proposed = auto(cluster, "validate_node", node=nodes["n04"])
    assert proposed.state == S.QUEUED  # n04 is not under maintenance
    other = auto(cluster, "validate_node", node=nodes["n06"])
    assert (other.state, other.blocked_by) == (S.AWAITING_APPROVAL, "maintenance")
    assert f"maintenance window #{window.pk}" in other.blocked_reason
    # The queued one does not start while the window lasts.
    assert services.action_execute(action_id=queued.pk).what == "held"
    queued.refresh_from_db()
    assert (queued.state, queued.blocked_by) == (S.QUEUED, "maintenance")
    # Once it is over, it runs.
    end_now(window)
    assert services.action_execute(action_id=queued.pk).what == "succeeded"
    queued.refresh_from_db()
    assert (queued.state, queued.blocked_by) == (S.SUCCEEDED, "")


def test_an_action_on_a_job_running_on_a_node_under_maintenance_is_held(cluster, nodes, job):
    queued = auto(cluster, "restart_job", job=job)
    assert queued.state == S.QUEUED
    window = declare(cluster, -60, 3600, ["n02"])  # the job runs on n01 and n02
    assert services.action_execute(action_id=queued.pk).what == "held"
    job_services.maintenance_window_cancel(window=window)
    assert services.action_execute(action_id=queued.pk).what == "succeeded"


def test_cancelling_the_window_sends_the_held_actions_at_once(
    cluster, nodes, job, run_on_commit, noop
):
    queued = auto(cluster, "cordon_node", node=nodes["n03"])
    window = declare(cluster, -60, 3600, ["n03"])
    assert services.action_execute(action_id=queued.pk).what == "held"
    with run_on_commit():
        job_services.maintenance_window_cancel(window=window)
    queued.refresh_from_db()
    assert queued.state == S.SUCCEEDED  # sent again by the receiver, run inline


def test_a_whole_cluster_window_holds_every_action(cluster, nodes, job):
    declare(cluster, -60, 3600)
    action = auto(cluster, "cordon_node", node=nodes["n09"])
    assert (action.state, action.blocked_by) == (S.AWAITING_APPROVAL, "maintenance")


def test_windows_past_or_ahead_hold_nothing(cluster, nodes, job):
    declare(cluster, -7200, 3600)
    declare(cluster, 3600, 3600)
    assert auto(cluster, "cordon_node", node=nodes["n09"]).state == S.QUEUED


def test_a_planned_incident_proposes_nothing(cluster, nodes, job):
    incident = make_incident(job, cause="planned", fault_type="gpu_xid", nodes=[nodes["n01"]])
    assert services.incident_propose(incident=incident) == []
    assert not Action.objects.exists()
    # the same incident, not planned, would have
    unplanned = make_incident(job, cause="gpu", fault_type="gpu_xid", nodes=[nodes["n01"]])
    assert services.incident_propose(incident=unplanned)


# --- before the window ---------------------------------------------------------------


def test_drain_at_next_checkpoint_proposes_a_replacement_once(cluster, nodes, job):
    window = declare(
        cluster, 300, 3600, ["n02", "n05"], pre_action="drain_at_next_checkpoint"
    )  # starts in 5 min, proposed 10 min ahead: due now
    first = services.maintenance_pre_actions_propose()
    assert first.windows == [window.pk]
    [action] = first.actions
    assert (action.kind, action.node.name, action.job.key) == (
        "replace_at_next_checkpoint",
        "n02",  # n05 runs no job
        "llm",
    )
    assert action.state == S.AWAITING_APPROVAL  # the maintenance policy's default
    assert action.params["maintenance_window"] == window.pk
    assert f"maintenance window #{window.pk}" in action.reason
    # Once: a second run (or the beat's task, twice) proposes nothing more.
    assert services.maintenance_pre_actions_propose().windows == []
    tasks.maintenance_pre_actions()
    tasks.maintenance_pre_actions()
    assert Action.objects.count() == 1
    window.refresh_from_db()
    assert window.pre_action_proposed_at is not None
    # While the window lasts, the maintenance guardrail lets its own action through.
    MaintenanceWindow.objects.filter(pk=window.pk).update(starts_at=timezone.now())
    ctx = guardrails.Context(None, timezone.now())
    assert guardrails.maintenance(action, ctx) is None
    other = Action(kind="restart_job", cluster=cluster, job=job, params={})
    assert guardrails.maintenance(other, ctx).startswith("maintenance:")


def test_nothing_is_proposed_before_the_lead_time(cluster, nodes, job):
    declare(cluster, 7200, 3600, ["n02"], pre_action="drain_at_next_checkpoint")
    assert services.maintenance_pre_actions_propose().windows == []
    assert not Action.objects.exists()


def test_checkpoint_now_proposes_one_checkpoint_per_running_job_once(
    cluster, nodes, job, noop, run_on_commit
):
    # Two jobs on the window's nodes (llm on n01+n02: one action, not one per node),
    # one elsewhere, one finished on them.
    other = make_job(cluster, nodes, key="other", on=("n03",))
    make_job(cluster, nodes, key="away", on=("n07",))
    done = make_job(cluster, nodes, key="done", on=("n02",))
    TrainingJob.objects.filter(pk=done.pk).update(status=TrainingJob.Status.COMPLETED)
    window = declare(cluster, 60, 3600, ["n01", "n02", "n03"], pre_action="checkpoint_now")
    with run_on_commit():
        tasks.maintenance_pre_actions()
        tasks.maintenance_pre_actions()  # a second beat: nothing more
    assert services.maintenance_pre_actions_propose().windows == []
    actions = list(Action.objects.order_by("job__key"))
    assert [(a.kind, a.job.key, a.node) for a in actions] == [
        ("checkpoint_job", "llm", None),
        ("checkpoint_job", "other", None),
    ]
    for action in actions:
        assert (action.mode, action.state) == ("auto", S.SUCCEEDED)  # safe: automatic
        assert action.params["maintenance_window"] == window.pk
        assert action.policy == "maintenance/checkpoint_job (default)"
        assert "save a checkpoint of job" in action.reason
        assert action.output["op"] == "checkpoint_job"
    assert sorted((c["op"], c["job"]) for c in noop.calls) == [
        ("checkpoint_job", "llm"),
        ("checkpoint_job", "other"),
    ]
    assert other.pk in {a.job_id for a in actions}
    # Inside the window, the maintenance guardrail lets the window's own request pass.
    MaintenanceWindow.objects.filter(pk=window.pk).update(starts_at=timezone.now())
    ctx = guardrails.Context(None, timezone.now())
    assert guardrails.maintenance(actions[0], ctx) is None
    assert guardrails.maintenance(
        Action(kind="checkpoint_job", cluster=cluster, job=job, params={}), ctx
    ).startswith("maintenance:")


def test_checkpoint_now_over_a_whole_cluster_asks_every_running_job(cluster, nodes, job):
    make_job(cluster, nodes, key="other", on=("n09",))
    declare(cluster, 60, 3600, pre_action="checkpoint_now")
    result = services.maintenance_pre_actions_propose()
    assert sorted(a.job.key for a in result.actions) == ["llm", "other"]
    assert {a.kind for a in result.actions} == {"checkpoint_job"}
    assert result.notices == []


def test_checkpoint_now_follows_the_policy(cluster, nodes, job, noop):
    # A cluster that wants a person to approve the request: it waits for approval.
    RecoveryPolicy.objects.create(
        cluster=cluster, trigger="maintenance", kind="checkpoint_job", mode="approval"
    )
    declare(cluster, 60, 3600, ["n01"], pre_action="checkpoint_now")
    [action] = services.maintenance_pre_actions_propose().actions
    assert (action.kind, action.state) == ("checkpoint_job", S.AWAITING_APPROVAL)
    assert noop.calls == []
    # Off: nothing proposed, and the result says so.
    Action.objects.all().delete()
    RecoveryPolicy.objects.filter(cluster=cluster).update(mode="off")
    declare(cluster, 60, 3600, ["n01"], pre_action="checkpoint_now")
    result = services.maintenance_pre_actions_propose()
    assert result.actions == []
    assert "policy for checkpoint_job is off" in result.notices[0]


def test_drain_at_next_checkpoint_proposes_no_checkpoint_job(cluster, nodes, job):
    declare(cluster, 60, 3600, ["n01"], pre_action="drain_at_next_checkpoint")
    assert [a.kind for a in services.maintenance_pre_actions_propose().actions] == [
        "replace_at_next_checkpoint"
    ]


def test_a_failed_delivery_fails_the_action_visibly(cluster, nodes, job, noop, run_on_commit):
    from recovery.drivers import DriverError

    noop.errors.append(DriverError("checkpoint_job of job llm: not supported by the x driver"))
    declare(cluster, 60, 3600, ["n01"], pre_action="checkpoint_now")
    with run_on_commit():
        tasks.maintenance_pre_actions()
    [action] = Action.objects.all()
    assert action.state == S.FAILED
    assert "not supported" in action.error


def test_a_whole_cluster_window_has_nowhere_to_move_jobs(cluster, nodes, job):
    declare(cluster, 60, 3600, pre_action="drain_at_next_checkpoint")
    result = services.maintenance_pre_actions_propose()
    assert result.actions == [] and "nowhere to move" in result.notices[0]


def test_a_cancelled_window_proposes_nothing(cluster, nodes, job):
    window = declare(cluster, 60, 3600, ["n01"], pre_action="drain_at_next_checkpoint")
    job_services.maintenance_window_cancel(window=window)
    assert services.maintenance_pre_actions_propose().windows == []


def test_the_beat_runs_it_on_the_default_queue():
    entry = settings.CELERY_BEAT_SCHEDULE["recovery-pre-maintenance"]
    assert entry["task"] == tasks.maintenance_pre_actions.name
    assert settings.REBOUND_TASK_QUEUES[entry["task"]] == "default"
