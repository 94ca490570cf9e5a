"""How notify hears of the apps to its left: incidents opening and resolving, actions
moving (incidents.signals, recovery.signals, each sent after its commit). Receivers
only record notifications (notify.services); delivery goes through the outbox."""

from notify import services
from notify.models import Event
from recovery.models import Action

S = Action.State


def on_incident_opened(sender, incident, **kwargs):
    services.event_record(
        event=Event.INCIDENT_OPENED, cluster_id=incident.cluster_id, incident=incident
    )


def on_incident_resolved(sender, incident, **kwargs):
    services.event_record(
        event=Event.INCIDENT_RESOLVED, cluster_id=incident.cluster_id, incident=incident
    )


def on_action_changed(sender, action, from_state, to_state, why, **kwargs):
    moved = from_state != to_state
    if moved and to_state == S.AWAITING_APPROVAL:
        services.event_record(
            event=Event.APPROVAL_WAITING,
            cluster_id=action.cluster_id,
            action=action,
            detail={"why": why},
        )
    elif moved and to_state == S.FAILED:
        services.event_record(
            event=Event.ACTION_FAILED,
            cluster_id=action.cluster_id,
            action=action,
            detail={"why": why},
        )
    # Held by the storm guardrail: proposed or sent back to the approval queue by it.
    if moved and to_state == S.AWAITING_APPROVAL and action.blocked_by.startswith("storm"):
        services.storm_trip_record(action=action)
