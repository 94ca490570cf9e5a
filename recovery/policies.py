"""Remediation policies: which incidents propose which actions, in which mode.

An incident falls under one trigger (`incident_trigger`). Each trigger has a
chain of rules, (action kind, mode) in order; a later rule is proposed only
once the earlier ones' actions for that incident have succeeded (cordon, then
replace). The defaults below are overridden per cluster and per job (which
wins) by RecoveryPolicy rows: a row changes a default's mode (`off` drops it)
or adds a kind to the chain.
"""

from dataclasses import dataclass

from incidents.models import Incident
from recovery.models import Action, RecoveryPolicy

K = Action.Kind
AUTO, APPROVAL, OFF = (
    RecoveryPolicy.Mode.AUTO,
    RecoveryPolicy.Mode.APPROVAL,
    RecoveryPolicy.Mode.OFF,
)

TRIGGERS = (
    "crash",
    "hardware",
    "dead_node",
    "straggler",
    "training_instability",
    "repeat_offender",
    "crash_loop",
    "preemption",
    "planned",
    "maintenance",
)

DEFAULTS: dict[str, list[tuple[str, str]]] = {
    # A crash, hang or network fault with no hardware sign: restart from the
    # latest durable checkpoint.
    "crash": [(K.RESTART_JOB, AUTO)],
    # A hardware Xid, ECC or SDC: isolate the node, then move the job to a spare.
    "hardware": [(K.CORDON_NODE, AUTO), (K.REPLACE_NODE, AUTO)],
    # A node fell silent: as hardware (storm protection guards a mass silence).
    "dead_node": [(K.CORDON_NODE, AUTO), (K.REPLACE_NODE, AUTO)],
    # A slow node: swap it at the next checkpoint, losing almost nothing.
    "straggler": [(K.REPLACE_AT_NEXT_CHECKPOINT, APPROVAL)],
    # A loss spike or NaN: roll back to the last checkpoint before it.
    "training_instability": [(K.ROLLBACK, APPROVAL)],
    # A node in several incidents: quarantine it.
    "repeat_offender": [(K.CORDON_NODE, APPROVAL)],
    # Restarting will not fix a loop: nothing automatic. The crash_loop guardrail
    # also turns the automatic restarts of the loop's crashes into approvals.
    "crash_loop": [],
    # The scheduler requeues a preempted job itself.
    "preemption": [],
    # An interruption inside a maintenance window: the people doing the maintenance
    # bring the job back; nothing automatic.
    "planned": [],
    # Not an incident: before a window starts (recovery.services.maintenance), its
    # pre_action drain_at_next_checkpoint moves each running job off its nodes at its
    # next checkpoint (a person approves: it relaunches the job), and checkpoint_now
    # asks each running job to save one (automatic: a save loses nothing).
    "maintenance": [(K.REPLACE_AT_NEXT_CHECKPOINT, APPROVAL), (K.CHECKPOINT_JOB, AUTO)],
}


def incident_trigger(incident: Incident) -> str:
    C = Incident.Cause
    if incident.cause == C.PLANNED:
        return "planned"
    if incident.fault_type == "crash_loop":
        return "crash_loop"
    if incident.fault_type == "repeat_offender":
        return "repeat_offender"
    if incident.cause == C.STRAGGLER:
        return "straggler"
    if incident.fault_type == "dead_node" or incident.cause == C.HOST:
        return "dead_node"
    if incident.cause in (C.GPU, C.MEMORY):
        return "hardware"
    if incident.cause == C.TRAINING_INSTABILITY:
        return "training_instability"
    if incident.cause == C.PREEMPTION:
        return "preemption"
    return "crash"  # software, hang, network, unknown: no hardware sign


@dataclass(frozen=True)
class Rule:
    trigger: str
    kind: str
    mode: str
    source: str  # "default", "cluster:<name>" or "job:<key>"

    @property
    def name(self) -> str:
        return f"{self.trigger}/{self.kind} ({self.source})"


def policy_rules(*, cluster_id: int, job_id: int | None, trigger: str) -> list[Rule]:
    """The chain in force for a trigger: the defaults, then the cluster's rows, then
    the job's; `off` rules are left out."""
    # Defaults sit at positions 10, 20, ...; a row without a position keeps its
    # default's, or goes last.
    chain: dict[str, tuple[int, str, str]] = {
        kind: (10 * (i + 1), mode, "default")
        for i, (kind, mode) in enumerate(DEFAULTS.get(trigger, []))
    }
    rows = RecoveryPolicy.objects.filter(cluster_id=cluster_id, trigger=trigger, job=None)
    overrides = list(rows.select_related("cluster"))
    if job_id is not None:
        overrides += list(
            RecoveryPolicy.objects.filter(job_id=job_id, trigger=trigger).select_related("job")
        )
    for row in overrides:  # cluster rows first, then the job's: the job's win
        known = chain.get(row.kind)
        position = row.position if row.position is not None else (known or (1000,))[0]
        source = f"job:{row.job.key}" if row.job_id else f"cluster:{row.cluster.name}"
        chain[row.kind] = (position, row.mode, source)
    ordered = sorted(chain.items(), key=lambda kv: kv[1][0])
    return [Rule(trigger, kind, mode, source) for kind, (_, mode, source) in ordered if mode != OFF]


def policy_table(*, cluster_id: int, job_id: int | None = None) -> dict[str, list[Rule]]:
    return {t: policy_rules(cluster_id=cluster_id, job_id=job_id, trigger=t) for t in TRIGGERS}
