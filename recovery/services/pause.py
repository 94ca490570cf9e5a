"""Each cluster's pause switch: paused, nothing automatic runs (new automatic
proposals wait for approval, queued actions are held); running ones finish."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from jobs.models import Cluster
from recovery.models import Action, ClusterRecoverySettings
from recovery.services.proposals import cluster_settings_lock

audit_log = logging.getLogger("rebound.audit")

S = Action.State


def cluster_pause(*, cluster: Cluster, actor: str, reason: str) -> ClusterRecoverySettings:
    """Stops new automatic actions (they wait for approval) and holds queued ones;
    running ones finish."""
    with transaction.atomic():
        cfg = cluster_settings_lock(cluster.pk)
        cfg.paused, cfg.pause_reason, cfg.paused_by = True, reason, actor
        cfg.paused_at = timezone.now()
        cfg.save()
        message = f"recovery on cluster {cluster.name} paused by {actor}: {reason}"
        transaction.on_commit(lambda: audit_log.info(message))
    return cfg


def cluster_resume(*, cluster: Cluster, actor: str) -> list[Action]:
    """Lifts the pause. Returns the cluster's queued actions (those the pause held
    among them), for the caller to send again."""
    with transaction.atomic():
        cfg = cluster_settings_lock(cluster.pk)
        was = cfg.pause_reason
        cfg.paused, cfg.pause_reason, cfg.paused_by, cfg.paused_at = False, "", "", None
        cfg.save()
        held = Action.objects.filter(cluster=cluster, state=S.QUEUED)
        held.filter(blocked_by="pause").update(blocked_by="", blocked_reason="")
        message = f"recovery on cluster {cluster.name} resumed by {actor} (paused for: {was})"
        transaction.on_commit(lambda: audit_log.info(message))
        return list(held)
