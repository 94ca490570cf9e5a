"""The wire vocabulary, defined once: event kinds, the sets of kinds each side
treats alike, fault types and the cause each points to, end reasons, and the
alphabets of job keys and node names.

Standard library only, and no import of the apps: the agent imports this module
beside torch code in training processes, where there is no Django. `jobs` (the
wire validator, `Event.Kind`), `incidents` (`FAULT_CAUSES`) and `agent` (the
reporter, the fault switches) all read it from here.
"""

import re

# What a client may send, in the order of the wire format's table (docs: design.md).
WIRE_KINDS = (
    "attempt_started",
    "ready",
    "checkpoint_load_started",
    "checkpoint_loaded",
    "step",
    "checkpoint_save_started",
    "checkpoint_saved",
    "rank_window",
    "heartbeat",
    "fault",
    "attempt_ended",
    "job_finished",
    "pause_started",
    "pause_ended",
)
# Written by the console itself, never sent: an operator reopened the finished job,
# so the finishes up to this event's ts no longer end it (jobs.services.job_reopen).
CONSOLE_KINDS = ("job_reopened",)
# What an event row may hold (jobs.models.Event.Kind is built from it).
EVENT_KINDS = WIRE_KINDS + CONSOLE_KINDS

# The kinds whose events may come without an attempt (a node's, not a launch's).
KINDS_WITHOUT_ATTEMPT = frozenset({"heartbeat", "fault"})

# The console's set: the kinds that shape a job's timeline, which the accounting
# and detection read (everything but steps, rank windows and heartbeats, which
# have tables or readers of their own). A tuple: its order is part of the partial
# indexes built on it (jobs.models.Event.Meta.indexes).
TIMELINE_KINDS = (
    "attempt_started",
    "ready",
    "checkpoint_load_started",
    "checkpoint_loaded",
    "checkpoint_save_started",
    "checkpoint_saved",
    "fault",
    "attempt_ended",
    "job_finished",
    "job_reopened",
    "pause_started",
    "pause_ended",
)
# Of those, the checkpoint saves, which come every few minutes for the job's whole life ...
CHECKPOINT_SAVE_KINDS = ("checkpoint_save_started", "checkpoint_saved")
# ... and the rest, the few per launch: what detection reads on every pass.
LAUNCH_KINDS = tuple(k for k in TIMELINE_KINDS if k not in CHECKPOINT_SAVE_KINDS)

# The agent's sets: under pressure the reporter sheds heartbeats first, then rank
# windows; every other kind it sends (steps included) is never shed, only spilled.
SHEDDABLE_KINDS = ("heartbeat", "rank_window")
# What the console keeps of the busiest kinds: a plain heartbeat (no data) is never
# stored raw (ingest folds it into its node's bucket; one with data, as the Slurm hooks
# send, is); rank windows keep their raw event only as long as a client may send it
# again (jobs.services.upkeep). A step's raw event is kept: one per step of rank 0, with
# whatever fields beyond the known ones it carries.
UNSTORED_KINDS = ("heartbeat",)
BRIEFLY_KEPT_KINDS = ("rank_window",)
NEVER_SHED_KINDS = frozenset(WIRE_KINDS) - frozenset(SHEDDABLE_KINDS)

# A `fault` event's `type`.
FAULT_TYPES = frozenset(
    {
        "crash",
        "hang",
        "nccl_timeout",
        "gpu_xid",
        "ecc",
        "oom",
        "nan",
        "loss_spike",
        "sdc",
        "preempted",
        "network",
        "other",
    }
)
# A fault the console infers rather than receives: a node whose heartbeats stopped.
DEAD_NODE = "dead_node"
# The incident cause and severity each fault type points to (values of
# incidents.models.Incident.Cause and .Severity). `gpu_xid` is not here: its Xid's
# class decides (incidents.xid); an unknown type is an unknown cause, major.
FAULT_CAUSES: dict[str, tuple[str, str]] = {
    "crash": ("software", "major"),
    "hang": ("hang", "major"),
    "nccl_timeout": ("network", "major"),
    "ecc": ("memory", "critical"),
    "oom": ("software", "major"),
    "nan": ("training_instability", "major"),
    "loss_spike": ("training_instability", "major"),
    "sdc": ("gpu", "critical"),
    "preempted": ("preemption", "minor"),
    "network": ("network", "major"),
    "other": ("unknown", "major"),
    DEAD_NODE: ("host", "critical"),
}

# An `attempt_ended` event's `reason`.
END_REASONS = frozenset({"completed", "failed", "killed", "preempted"})

# The alphabets of names that end up in URLs, pages, file names and the database.
# Checked with \A...\Z: `$` would let a trailing newline through. Job keys are
# slugs; node names are host names (letters, digits, '.', '-', '_', starting with
# a letter or digit), never '/' (a node's page is /nodes/<cluster>/<name>/).
JOB_KEY = re.compile(r"\A[A-Za-z0-9_-]{1,100}\Z")
NODE_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
