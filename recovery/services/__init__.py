"""Writes of the recovery app, one module per concern:

- `actions`: the state machine, its one move function and the record of each move;
- `proposals`: proposing an action (what it may name, the lease, its route);
- `approvals`: a person's decisions, expiry and retirement of approvals;
- `decisions`: from the policies to the proposals for an incident;
- `execution`: running a queued action, and the reconciler;
- `pause`: each cluster's pause switch;
- `maintenance`: the pre-maintenance proposals of maintenance windows about to start;
- `launches`: the gate in front of a new launch, and its number.

Services record and never send a task: their callers send what a new state calls
for through `recovery.queue`. The names below are the public ones, so that
`from recovery import services; services.action_approve(...)` reads the same
wherever a function lives.
"""

from recovery.errors import InvalidAction, LaunchRefused, OwnAction, Refused
from recovery.services.actions import (
    QUEUE_GRACE_S,
    TRANSITIONS,
    InvalidTransition,
    action_transition,
)
from recovery.services.approvals import (
    action_approve,
    action_cancel,
    action_reject,
    approvals_expire,
    approvals_retire,
)
from recovery.services.decisions import action_follow_up, incident_propose
from recovery.services.execution import (
    DEADLINE_GRACE_S,
    MAX_ATTEMPTS,
    TIME_LIMITS_S,
    Outcome,
    Reconciled,
    action_execute,
    actions_reconcile,
    backoff_s,
)
from recovery.services.launches import launch_admit, launch_gate
from recovery.services.maintenance import PreMaintenance, maintenance_pre_actions_propose
from recovery.services.pause import cluster_pause, cluster_resume
from recovery.services.proposals import action_propose

__all__ = [
    "DEADLINE_GRACE_S",
    "MAX_ATTEMPTS",
    "QUEUE_GRACE_S",
    "TIME_LIMITS_S",
    "TRANSITIONS",
    "InvalidAction",
    "InvalidTransition",
    "LaunchRefused",
    "Outcome",
    "OwnAction",
    "PreMaintenance",
    "Reconciled",
    "Refused",
    "action_approve",
    "action_cancel",
    "action_execute",
    "action_follow_up",
    "action_propose",
    "action_reject",
    "action_transition",
    "actions_reconcile",
    "approvals_expire",
    "approvals_retire",
    "backoff_s",
    "cluster_pause",
    "cluster_resume",
    "incident_propose",
    "launch_admit",
    "launch_gate",
    "maintenance_pre_actions_propose",
]
