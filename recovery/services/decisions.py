"""From policy to proposals: what the policies in force (recovery.policies) say for
an open incident is proposed rule by rule, a chain's next rule once the earlier
ones succeeded; when an action ends, the open incidents around it may go on."""

from __future__ import annotations

import logging

from django.db.models import Q

from common.errors import AppError
from incidents.models import Incident
from jobs.models import Node
from jobs.selectors import checkpoints_durable_latest_first
from recovery import guardrails
from recovery.models import Action
from recovery.policies import Rule, incident_trigger, policy_rules
from recovery.services.actions import JOB_AND_NODE_KINDS, NODE_KINDS
from recovery.services.proposals import action_propose

logger = logging.getLogger(__name__)

K = Action.Kind
S = Action.State


def _rule_targets(rule: Rule, incident: Incident, nodes: list[Node]):
    """(node, job, params) per action the rule proposes for the incident; empty when
    it does not apply (no node named, the job is finished, nothing to roll back to)."""
    job = incident.job
    if rule.kind in NODE_KINDS:
        return [(n, None, {}) for n in nodes]
    if job.status in guardrails.FINISHED_JOB:
        return []
    if rule.kind == K.RESTART_JOB:
        return [(None, job, {})]
    if rule.kind == K.ROLLBACK:
        before = checkpoints_durable_latest_first(job, saved_by=incident.fault_at)
        step = before.values_list("step", flat=True).first()
        return [] if step is None else [(None, job, {"step": step})]
    if rule.kind in JOB_AND_NODE_KINDS:
        return [(n, job, {}) for n in nodes]
    if rule.kind == K.SCALE_DOWN:
        return [(n, job, {}) for n in nodes]
    return []


def incident_propose(*, incident: Incident) -> list[Action]:
    """Proposes what the policies in force say for an open incident, rule by rule:
    a rule's actions are proposed once the earlier rules' actions for this incident
    have succeeded. Safe to run again (each proposal happens once); it runs when
    the incident opens or changes, and when one of its actions ends."""
    if incident.state not in Incident.OPEN_STATES:
        return []
    trigger = incident_trigger(incident)
    rules = policy_rules(cluster_id=incident.cluster_id, job_id=incident.job_id, trigger=trigger)
    if not rules:
        return []
    nodes = list(incident.nodes.order_by("name"))
    earlier = {
        (a.kind, a.node_id): a for a in Action.objects.filter(incident=incident).exclude(policy="")
    }
    created = []
    for rule in rules:
        all_done = True
        for node, job, params in _rule_targets(rule, incident, nodes):
            prior = earlier.get((rule.kind, node.pk if node else None))
            if prior is None:
                try:
                    prior = action_propose(
                        cluster=incident.cluster,
                        kind=rule.kind,
                        node=node,
                        job=job,
                        params=params,
                        incident=incident,
                        reason=f"incident #{incident.pk}: {incident.summary}",
                        requested_by=f"policy:{trigger}",
                        mode=rule.mode,
                        policy=rule.name,
                        dedup_key=f"incident:{incident.pk}:{rule.kind}:{node.pk if node else '-'}",
                    )
                    created.append(prior)
                except AppError as exc:  # refused (a lease, a duplicate) or invalid
                    logger.info(
                        "incident #%s: %s not proposed yet: %s", incident.pk, rule.kind, exc.detail
                    )
                    all_done = False
                    continue
            if prior.state != S.SUCCEEDED:
                all_done = False
        if not all_done:
            break
    return created


def action_follow_up(*, action: Action) -> list[Action]:
    """After an action ended: the open incidents on its job or node may now propose
    their next step (the next rule of a chain, or one the lease held back)."""
    where = Q()
    if action.job_id:
        where |= Q(job_id=action.job_id)
    if action.node_id:
        where |= Q(nodes=action.node_id)
    if action.incident_id:
        where |= Q(pk=action.incident_id)
    if not where:
        return []
    created = []
    incidents = (
        Incident.objects.filter(where, state__in=Incident.OPEN_STATES)
        .select_related("job", "cluster")
        .distinct()
        .order_by("opened_at", "id")
    )
    for incident in incidents[:20]:
        created += incident_propose(incident=incident)
    return created
