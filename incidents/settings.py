"""Detector parameters: the defaults, overridden per cluster and per job at run time.

A job's own DetectorSetting wins over its cluster's, which wins over the
default here (`detector_settings_resolve`, the one place that says so). Values
are read once per detection pass, so a change made through `detector_settings_update`
takes effect at the next pass, without a restart.

The same rows hold each cluster's Alertmanager mapping (`alerts.*`: which labels name
a node, which rules map an alert to a fault; see incidents.alerts), read on every
delivery; their values are lists and words, so they have their own defaults, checks
and API (`alert_settings*`), written the same way.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Q

from common.errors import Invalid
from common.vocabulary import DEAD_NODE, FAULT_TYPES
from incidents.models import DetectorSetting
from jobs.models import Cluster, TrainingJob

audit = logging.getLogger("rebound.audit")

DEFAULTS: dict[str, float | int] = {
    # Crash loop (NVRx's nvrx-watch): this many launches within the window is a
    # restart storm; this many ended launches in a row that never advanced the
    # checkpoint is a loop that restarting will not fix.
    "crash_loop.launches": 5,
    "crash_loop.window_s": 1800,
    "crash_loop.no_progress_launches": 3,
    # Hang: no step for longer than factor x the longest step interval learned
    # (this launch's, past its first steps, or earlier launches', smoothed),
    # never less than the floor; more while a checkpoint save is in flight.
    "hang.factor": 5,
    "hang.floor_s": 60,
    "hang.skip_steps": 3,
    "hang.warmup_timeout_s": 900,  # a launch's first steps (compiling), at the least
    "hang.save_allowance_s": 600,
    "hang.smoothing": 0.5,
    # An announced pause (an evaluation) is not a stall, up to this long.
    "hang.pause_max_s": 7200,
    # Straggler: a node whose ranks are slow (either score below 0.75) this many
    # complete windows in a row.
    "straggler.windows": 3,
    # Repeat offender: a node in this many incidents within the window.
    "repeat_offender.incidents": 3,
    "repeat_offender.window_s": 7 * 86400,
    # Dead node: a node that sent heartbeats and fell silent this long.
    "dead_node.timeout_s": 30,
    # Loss: NaN or infinity at once; a spike when the loss rises above the
    # rolling median of the last `window` losses by `mad_factor` robust
    # deviations and by `min_rel` of the median at least.
    "loss.window": 50,
    "loss.mad_factor": 8,
    "loss.min_rel": 0.25,
    "loss.warmup_steps": 50,
    # A fault after this many more steps of the same launch is a new episode,
    # not a symptom of the one before.
    "episode.progress_steps": 10,
}


# One line each, shown beside the value in the API and the admin.
DESCRIPTIONS: dict[str, str] = {
    "crash_loop.launches": "Launches within crash_loop.window_s that make a restart storm.",
    "crash_loop.window_s": "Window (s) in which crash_loop.launches launches make a storm.",
    "crash_loop.no_progress_launches": (
        "Ended launches in a row without a newer checkpoint that make a crash loop."
    ),
    "hang.factor": "A hang: no step for this many times the longest step interval learned.",
    "hang.floor_s": "The hang timeout is never shorter than this (s).",
    "hang.skip_steps": "First steps of a launch not learned from (warm-up is slow).",
    "hang.warmup_timeout_s": "Hang timeout (s) at the least for a launch's first steps.",
    "hang.save_allowance_s": "Extra time (s) allowed when a checkpoint save started in the gap.",
    "hang.smoothing": "Weight (0..1] of the latest launch in the interval learned across launches.",
    "hang.pause_max_s": "Longest announced pause (s) left out of a hang's gap; beyond, it counts.",
    "straggler.windows": "Complete rank windows in a row a node must be slow to be a straggler.",
    "repeat_offender.incidents": "Incidents naming one node within the window that flag it.",
    "repeat_offender.window_s": "Window (s) for repeat_offender.incidents.",
    "dead_node.timeout_s": "Silence (s) after which a node that sent heartbeats is dead.",
    "loss.window": "Number of previous losses whose rolling median a spike is measured against.",
    "loss.mad_factor": "Robust deviations (1.4826 x MAD) above the median that make a spike.",
    "loss.min_rel": "A spike also exceeds the median by at least this fraction of it.",
    "loss.warmup_steps": "Losses a launch reports before spikes are looked for.",
    "episode.progress_steps": "Steps after a launch's fault that make a later fault a new episode.",
}

# Counts: whole numbers. Every parameter is > 0 (a few may be 0); hang.smoothing is in (0, 1].
INTEGERS = frozenset(
    {
        "hang.skip_steps",
        "loss.window",
        "loss.warmup_steps",
        "straggler.windows",
        "repeat_offender.incidents",
        "crash_loop.launches",
        "crash_loop.no_progress_launches",
        "episode.progress_steps",
    }
)
AT_MOST_ONE = frozenset({"hang.smoothing"})
# "None": skip no steps, look for spikes from the first window, no save allowance, no
# announced pause left out.
ZERO_OK = frozenset(
    {"hang.skip_steps", "loss.warmup_steps", "hang.save_allowance_s", "hang.pause_max_s"}
)
MAX_VALUE = 1e9  # far above any sensible count or number of seconds (31 years)


@dataclass(frozen=True)
class Resolved:
    """One parameter: its default, the cluster's and the job's override (rows, or None)."""

    name: str
    default: float | int
    on_cluster: DetectorSetting | None
    on_job: DetectorSetting | None

    @property
    def in_force(self) -> DetectorSetting | None:
        """The override that applies: the job's, else the cluster's."""
        return self.on_job if self.on_job is not None else self.on_cluster

    @property
    def value(self) -> float | int:
        return self.default if self.in_force is None else self.in_force.value


def detector_settings_resolve(
    *, cluster_id: int | None, job: TrainingJob | None = None
) -> list[Resolved]:
    """Every parameter, in DEFAULTS order, resolved default -> cluster -> job."""
    scope = Q(cluster_id=cluster_id, job=None)
    if job is not None:
        scope |= Q(job=job)
    on_cluster, on_job = {}, {}
    for row in DetectorSetting.objects.filter(scope):
        (on_cluster if row.job_id is None else on_job)[row.name] = row
    return [
        Resolved(name, default, on_cluster.get(name), on_job.get(name))
        for name, default in DEFAULTS.items()
    ]


def detector_settings(job: TrainingJob | None, *, cluster_id: int | None = None) -> dict:
    """All parameters in force for `job` (or, without one, for the cluster)."""
    cluster_id = job.cluster_id if job is not None else cluster_id
    return {r.name: r.value for r in detector_settings_resolve(cluster_id=cluster_id, job=job)}


# --- the API's read and write ---------------------------------------------------


class InvalidSettings(Invalid):
    """Values that may not be set; `errors` names each: {"name", "reason"}."""

    code = "invalid_settings"

    def __init__(self, errors: list[dict[str, str]], *, given: int):
        super().__init__(
            f"{len(errors)} of {given} values are invalid; nothing was changed.", errors=errors
        )
        self.errors = errors


def detector_setting_check(name: str, value: Any) -> tuple[float | int | None, str | None]:
    """`value` as stored for parameter `name` (None: remove the override), or why not."""
    if name not in DEFAULTS:
        return None, "unknown parameter"
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None, "must be a number (or null to remove the override)"
    if value < 0 or (value == 0 and name not in ZERO_OK):
        return None, "must be at least 0" if name in ZERO_OK else "must be greater than 0"
    if value > MAX_VALUE:  # detectors take float(value); a huge int would not convert
        return None, f"must be at most {MAX_VALUE:.0f}"
    if name in INTEGERS:
        if value != int(value):
            return None, "must be a whole number"
        value = int(value)
    if name in AT_MOST_ONE and value > 1:
        return None, "must be greater than 0 and at most 1"
    return value, None


def _scope_rows(cluster: Cluster, job: TrainingJob | None):
    if job is not None and job.cluster_id != cluster.pk:
        raise ValueError(f"job {job.key} is not on cluster {cluster.name}")
    if job is not None:
        return DetectorSetting.objects.filter(job=job)
    return DetectorSetting.objects.filter(cluster=cluster, job=None)


def detector_settings_table(*, cluster: Cluster, job: TrainingJob | None = None) -> list[dict]:
    """Every parameter, in DEFAULTS order, with its default, the cluster's and the
    job's override and the value in force (as `detector_settings_resolve` decides it), and
    who set the override in force, when."""
    if job is not None and job.cluster_id != cluster.pk:
        raise ValueError(f"job {job.key} is not on cluster {cluster.name}")
    table = []
    for r in detector_settings_resolve(cluster_id=cluster.pk, job=job):
        in_force = r.in_force
        table.append(
            {
                "name": r.name,
                "description": DESCRIPTIONS[r.name],
                "default": r.default,
                "cluster_value": None if r.on_cluster is None else r.on_cluster.value,
                "job_value": None if r.on_job is None else r.on_job.value,
                "value": r.value,
                "updated_at": None if in_force is None else in_force.updated_at,
                "updated_by": None if in_force is None else in_force.updated_by,
            }
        )
    return table


@dataclass(frozen=True)
class SettingChange:
    name: str
    scope: str  # "cluster east" or "job j1"
    old: float | int | None  # None: no override (the default or the cluster's applied)
    new: float | int | None


def detector_settings_update(
    *, cluster: Cluster, job: TrainingJob | None = None, values: dict[str, Any], actor: str
) -> list[SettingChange]:
    """Set the overrides of `cluster` (or of `job`, on that cluster): a value sets one,
    null removes it. All or nothing: any invalid value raises InvalidSettings and
    nothing is written. Each change is logged to "rebound.audit" once committed, and
    the row keeps who made it; a value equal to the override in place changes nothing.
    """
    return _settings_write(cluster, job, values, actor, detector_setting_check)


def _settings_write(cluster, job, values, actor, check) -> list[SettingChange]:
    checked, errors = {}, []
    for name, value in values.items():
        checked[name], reason = check(name, value)
        if reason:
            errors.append({"name": name, "reason": reason})
    if errors:
        raise InvalidSettings(errors, given=len(values))
    scope = f"job {job.key}" if job is not None else f"cluster {cluster.name}"
    changes = []
    with transaction.atomic():
        # Settings writes of a cluster take turns: two first overrides of the same
        # name would otherwise both insert, and the old value logged would be stale.
        # NO KEY: ingest's inserts that reference the cluster are not held up.
        Cluster.objects.select_for_update(no_key=True).get(pk=cluster.pk)
        rows = {r.name: r for r in _scope_rows(cluster, job).filter(name__in=checked)}
        for name, new in sorted(checked.items()):
            row = rows.get(name)
            old = None if row is None else row.value
            if old == new:
                continue
            if new is None:
                row.delete()
            elif row is None:
                DetectorSetting.objects.create(
                    cluster=cluster, job=job, name=name, value=new, updated_by=actor
                )
            else:
                row.value, row.updated_by = new, actor
                row.save(update_fields=["value", "updated_by", "updated_at"])
            changes.append(SettingChange(name, scope, old, new))
        if changes:
            transaction.on_commit(lambda: _audit(changes, actor))
    return changes


def _audit(changes: list[SettingChange], actor: str) -> None:
    for c in changes:
        audit.info(
            "detector setting %s for %s changed from %s to %s by %s",
            c.name,
            c.scope,
            "unset" if c.old is None else c.old,
            "unset" if c.new is None else c.new,
            actor or "unknown",
            extra={
                "setting": c.name,
                "scope": c.scope,
                "old": c.old,
                "new": c.new,
                "actor": actor,
            },
        )


# --- Alertmanager's mapping (incidents.alerts) ------------------------------------
# Kept in the same rows as the detector parameters (DetectorSetting, per cluster only),
# but apart from them: their values are lists and words, not numbers, and the detector
# settings API stays numbers only. `alert_settings_update` writes them the same way.

FAULT_WORDS = sorted(FAULT_TYPES | {DEAD_NODE})  # what a rule may map an alert to
IGNORE = "ignore"
ALERT_DEFAULTS: dict[str, Any] = {
    # The labels that name an alert's node, the first present wins; a value's `:port`
    # (as `instance` carries it) is left out.
    "alerts.node_labels": [
        "node",
        "Hostname",
        "hostname",
        "kubernetes_node",
        "nodename",
        "instance",
    ],
    # The cluster's own rules, tried in order before the built-in ones.
    "alerts.rules": [],
    # What an alert no rule maps becomes: ignored (recorded only), or a fault type.
    "alerts.unmatched": IGNORE,
}
ALERT_DESCRIPTIONS: dict[str, str] = {
    "alerts.node_labels": "Labels naming an alert's node, the first present wins (':port' cut).",
    "alerts.rules": (
        "Rules tried before the built-in ones: [{name, match: {label: regex}, fault, xid}]."
    ),
    "alerts.unmatched": "What an alert no rule maps becomes: 'ignore' or a fault type.",
}
LABEL_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,99}\Z")
MAX_NODE_LABELS = 20
MAX_RULES = 50
MAX_PATTERN = 500
RULE_KEYS = frozenset({"name", "match", "fault", "xid"})
XID_MAX = 2**31 - 1


def _check_rule(rule: Any) -> str | None:
    """Why `rule` is not a rule, or None."""
    if not isinstance(rule, dict):
        return "must be an object {name, match, fault, xid}"
    if set(rule) - RULE_KEYS:
        return f"unknown key(s): {', '.join(sorted(map(str, set(rule) - RULE_KEYS)))}"
    name = rule.get("name", "")
    if not isinstance(name, str) or len(name) > 100:
        return "name must be a string of at most 100 characters"
    match = rule.get("match", {})
    if not isinstance(match, dict):
        return "match must be an object: label name -> regular expression"
    for label, pattern in match.items():
        if not LABEL_NAME.match(label):
            return f"match: {label[:100]!r} is not a label name"
        if not isinstance(pattern, str) or len(pattern) > MAX_PATTERN or "\x00" in pattern:
            return f"match.{label}: must be a string of at most {MAX_PATTERN} characters"
        try:
            re.compile(pattern)
        except re.error as exc:
            return f"match.{label}: not a regular expression ({exc})"
    if rule.get("fault") not in [*FAULT_WORDS, IGNORE]:
        return f"fault must be one of: {', '.join([*FAULT_WORDS, IGNORE])}"
    xid = rule.get("xid")
    if xid is not None and (type(xid) is not int or not 0 <= xid <= XID_MAX):
        return f"xid must be a whole number from 0 to {XID_MAX}"
    return None


def alert_setting_check(name: str, value: Any) -> tuple[Any, str | None]:
    """`value` as stored for alert setting `name` (None: remove the override), or why not."""
    if name not in ALERT_DEFAULTS:
        return None, "unknown parameter"
    if value is None:
        return None, None
    if name == "alerts.node_labels":
        ok = (
            isinstance(value, list)
            and 1 <= len(value) <= MAX_NODE_LABELS
            and all(isinstance(v, str) and LABEL_NAME.match(v) for v in value)
        )
        return (value, None) if ok else (None, f"must be 1 to {MAX_NODE_LABELS} label names")
    if name == "alerts.rules":
        if not isinstance(value, list) or len(value) > MAX_RULES:
            return None, f"must be a list of at most {MAX_RULES} rules"
        for k, rule in enumerate(value):
            reason = _check_rule(rule)
            if reason:
                return None, f"rule {k}: {reason}"
        return value, None
    if value not in [*FAULT_WORDS, IGNORE]:
        return None, f"must be one of: {', '.join([IGNORE, *FAULT_WORDS])}"
    return value, None


def alert_settings(*, cluster_id: int) -> dict[str, Any]:
    """The alert mapping in force for a cluster: its overrides, else the defaults."""
    rows = DetectorSetting.objects.filter(
        cluster_id=cluster_id, job=None, name__in=list(ALERT_DEFAULTS)
    ).values_list("name", "value")
    return {**ALERT_DEFAULTS, **dict(rows)}


def alert_settings_table(*, cluster: Cluster) -> list[dict]:
    """Each alert setting with its default, the cluster's override and the value in force."""
    rows = {
        r.name: r
        for r in DetectorSetting.objects.filter(
            cluster=cluster, job=None, name__in=list(ALERT_DEFAULTS)
        )
    }
    table = []
    for name, default in ALERT_DEFAULTS.items():
        row = rows.get(name)
        table.append(
            {
                "name": name,
                "description": ALERT_DESCRIPTIONS[name],
                "default": default,
                "cluster_value": None if row is None else row.value,
                "value": default if row is None else row.value,
                "updated_at": None if row is None else row.updated_at,
                "updated_by": None if row is None else row.updated_by,
            }
        )
    return table


def alert_settings_update(
    *, cluster: Cluster, values: dict[str, Any], actor: str
) -> list[SettingChange]:
    """Set (or, with null, remove) a cluster's alert settings: all or nothing, audited,
    as `detector_settings_update`."""
    return _settings_write(cluster, None, values, actor, alert_setting_check)
