"""How recovery hears of the apps to its left: incidents opening or changing, jobs
saving checkpoints, and maintenance windows declared or cancelled. Receivers only
hand ids to Celery (recovery.queue), once committed."""

from incidents.models import Incident
from recovery import queue
from recovery.models import Action
from recovery.selectors import actions_waiting_for_checkpoint


def on_incident_opened(sender, incident, **kwargs):
    queue.incident_propose_send(incident.pk)


def on_incident_updated(sender, incident, **kwargs):
    """Its cause or nodes may have changed (a hardware Xid named after the crash):
    what the policies say may have changed too. Closed incidents propose nothing."""
    if incident.state in Incident.OPEN_STATES:
        on_incident_opened(sender, incident)


def on_events_stored(sender, job_ids, kinds, **kwargs):
    """A checkpoint was saved: replacements waiting for one may go."""
    saved = [j for j in job_ids if "checkpoint_saved" in kinds.get(j, ())]
    if saved:
        for action in actions_waiting_for_checkpoint(job_ids=saved):
            queue.action_execute_send(action)


def on_maintenance_changed(sender, window_id, cluster_id, **kwargs):
    """A window was cancelled (or declared): the actions it held may go now, without
    waiting for the reconciler; those still under maintenance are held again."""
    held = Action.objects.filter(
        cluster_id=cluster_id, state=Action.State.QUEUED, blocked_by="maintenance"
    )
    for action in held:
        queue.action_execute_send(action)
