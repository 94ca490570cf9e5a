"""How recovery hears of the apps to its left: incidents opening or changing, and
jobs saving checkpoints. Receivers only hand ids to Celery, once committed."""

from django.db import transaction

from recovery.guardrails import OPEN_INCIDENT


def on_incident_opened(sender, incident, **kwargs):
    from recovery.tasks import propose_for_incident

    pk = incident.pk
    transaction.on_commit(lambda: propose_for_incident.delay(pk), robust=True)


def on_incident_updated(sender, incident, **kwargs):
    """Its cause or nodes may have changed (a hardware Xid named after the crash):
    what the policies say may have changed too. Closed incidents propose nothing."""
    if incident.state in OPEN_INCIDENT:
        on_incident_opened(sender, incident)


def on_events_stored(sender, job_ids, kinds, **kwargs):
    """A checkpoint was saved: replacements waiting for one may go."""
    from recovery.services import actions_on_checkpoint

    saved = [j for j in job_ids if "checkpoint_saved" in kinds.get(j, ())]
    if saved:
        actions_on_checkpoint(job_ids=saved)
