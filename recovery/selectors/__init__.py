"""Reads of the recovery app, one module per concern (they never write):

- `actions`: the action list and one action, a cluster's recovery settings, who
  requested an action, a node's actions, replacements waiting for a checkpoint;
- `evidence`: what an approver weighs for one action (GPU-hours at stake, ranks);
- `approvals`: the approval page's batched reads and the actions decided lately;
- `phases`: where an incident's time to recover went (people or machines).

The names below are the public ones: `from recovery.selectors import action_list`
reads the same wherever a function lives.
"""

from recovery.selectors.actions import (
    action_detail,
    action_is_own,
    action_list,
    actions_waiting_for_checkpoint,
    cluster_settings,
    job_latest_durable_step,
    node_actions,
    nodes_current_actions,
)
from recovery.selectors.approvals import approval_queue, approvals_decided, cluster_guardrails
from recovery.selectors.evidence import (
    action_evidence,
    gpu_hours_at_stake,
    rank_ranges,
    ranks_on_nodes,
    stake_figures,
)
from recovery.selectors.phases import incident_phases, incidents_phases, phases_summary

__all__ = [
    "action_detail",
    "action_evidence",
    "action_is_own",
    "action_list",
    "actions_waiting_for_checkpoint",
    "approval_queue",
    "approvals_decided",
    "cluster_guardrails",
    "cluster_settings",
    "gpu_hours_at_stake",
    "incident_phases",
    "incidents_phases",
    "job_latest_durable_step",
    "node_actions",
    "nodes_current_actions",
    "phases_summary",
    "rank_ranges",
    "ranks_on_nodes",
    "stake_figures",
]
