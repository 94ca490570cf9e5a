"""Alertmanager in: its webhook's alerts read strictly, mapped to a node and a fault,
and turned into the faults a job would have reported itself.

An alert names a node (the first present of the cluster's `alerts.node_labels`) and
stands for a fault (the cluster's `alerts.rules`, then the built-in rules below, then
`alerts.unmatched`; a `rebound_fault` label overrides them all). A firing alert on a
node that runs jobs becomes one wire `fault` event per job, stored through ingest
(`jobs.services.events_ingest`), so the launch-fault detector opens or joins the
incident exactly as for a fault the job reported: one incident per fault episode. The
quick detection pass runs at once, in the same transaction, so the incident is there
when Alertmanager is answered; the usual follow-up (the outbox) runs after it.
A firing alert on a node that runs no job marks the node suspect. A repeat of a
firing alert (Alertmanager's repeat_interval) reports the fault to the jobs that
started on its node since. A resolved alert resolves the incidents it alone stands
behind. Every receipt is on the timelines.

Idempotent: an alert is one row per (cluster, fingerprint, startsAt) and its events'
ids derive from the same, so a delivery repeated changes nothing but when it was last
heard. One delivery is one transaction: all of it is stored, or none.

(Long module: about 610 lines, one path from the webhook's bytes to the incidents,
read in one place: the payload's checks, the mapping, the receipt.)
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import orjson
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from common.errors import Invalid
from common.time import dt, parse_ts
from incidents.detectors.episodes import LAUNCH_FAULT
from incidents.models import Alert, Incident, TimelineEntry
from incidents.selectors import nodes_running_launches
from incidents.services import incident_resolve, incidents_detect_pass, timeline_entry_add
from incidents.settings import (
    ALERT_DEFAULTS,
    FAULT_WORDS,
    IGNORE,
    alert_setting_check,
    alert_settings,
)
from jobs.models import Cluster, Node, TrainingJob
from jobs.services import events_ingest, node_mark_suspect
from jobs.wire import WireEvent

logger = logging.getLogger(__name__)

ACTOR = "alertmanager"
VERSION = "4"  # the webhook payload's version this reads
MAX_ALERTS = 1000  # a group's alerts in one delivery (Alertmanager's max_alerts caps it)
MAX_LABELS = 200
MAX_NAME = 200
MAX_VALUE = 10000
MAX_TEXT = 2000  # receiver, groupKey, URLs
FINGERPRINT = re.compile(r"\A[0-9A-Za-z]{1,64}\Z")
ZERO_TIME = re.compile(r"\A0001-01-01T00:00:00(\.0+)?(Z|[+-]00:00)\Z")  # Go's zero time
STATUSES = ("firing", "resolved")
OVERRIDE_LABEL = "rebound_fault"
MESSAGE_MAX = 1000


class InvalidAlerts(Invalid):
    """A webhook payload that is not Alertmanager's: `errors` names each field."""

    code = "invalid_alerts"

    def __init__(self, errors: list[dict[str, str]]):
        first = errors[0]
        super().__init__(
            f"{first['field']}: {first['reason']}"
            + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
            + "; nothing was stored.",
            errors=errors,
        )


@dataclass(frozen=True)
class ParsedAlert:
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    ends_at: float | None
    generator_url: str
    fingerprint: str


# --- reading the payload ---------------------------------------------------------


def _storable(s: str) -> bool:
    if "\x00" in s:
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Reader:
    """Collects every problem of a payload as {"field", "reason"}."""

    def __init__(self):
        self.errors: list[dict[str, str]] = []

    def bad(self, where: str, reason: str) -> None:
        self.errors.append({"field": where, "reason": reason})

    def text(self, obj: dict, key: str, where: str, *, required: bool, limit=MAX_TEXT) -> str:
        if key not in obj:
            if required:
                self.bad(where, "is required")
            return ""
        v = obj[key]
        if not isinstance(v, str):
            self.bad(where, "must be a string")
        elif len(v) > limit:
            self.bad(where, f"must be at most {limit} characters")
        elif not _storable(v):
            self.bad(where, "must not contain NUL or lone surrogates")
        else:
            return v
        return ""

    def pairs(self, obj: dict, key: str, where: str, *, required: bool) -> dict[str, str]:
        """A label set: an object of strings."""
        if key not in obj:
            if required:
                self.bad(where, "is required")
            return {}
        v = obj[key]
        if not isinstance(v, dict):
            self.bad(where, "must be an object of strings")
            return {}
        if len(v) > MAX_LABELS:
            self.bad(where, f"must hold at most {MAX_LABELS} entries")
            return {}
        for name in v:
            if not name or len(name) > MAX_NAME or not _storable(name):
                self.bad(where, f"{name[:50]!r} is not a name (1 to {MAX_NAME} characters)")
            else:
                self.text(v, name, f"{where}.{name}", required=True, limit=MAX_VALUE)
        return v

    def time(self, obj: dict, key: str, where: str, *, required: bool) -> float | None:
        v = obj.get(key)
        if v is None and not required:
            return None
        if isinstance(v, str) and ZERO_TIME.match(v):  # Alertmanager's "no end yet"
            if required:
                self.bad(where, "must be a time, not Go's zero time")
            return None
        ts = parse_ts(v) if isinstance(v, str) else None
        if ts is None:
            self.bad(where, "must be an RFC 3339 date-time with an offset, 2000..2100")
        return ts


def webhook_parse(body: bytes) -> list[ParsedAlert]:
    """The alerts of an Alertmanager webhook body (payload version 4); InvalidAlerts
    naming every bad field otherwise. Fields Alertmanager may add later are ignored."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidAlerts([{"field": "body", "reason": f"not JSON: {exc}"}]) from None
    if not isinstance(payload, dict):
        raise InvalidAlerts([{"field": "body", "reason": "must be a JSON object"}])
    r = _Reader()
    if payload.get("version") != VERSION:
        r.bad("version", f'must be "{VERSION}" (Alertmanager\'s webhook payload)')
    if payload.get("status") not in STATUSES:
        r.bad("status", "must be firing or resolved")
    for key in ("receiver", "groupKey"):
        r.text(payload, key, key, required=True)
    r.text(payload, "externalURL", "externalURL", required=False)
    for key in ("groupLabels", "commonLabels", "commonAnnotations"):
        r.pairs(payload, key, key, required=False)
    truncated = payload.get("truncatedAlerts", 0)
    if type(truncated) is not int or not 0 <= truncated < 2**31:
        r.bad("truncatedAlerts", "must be a whole number, at least 0")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list) or not 1 <= len(alerts) <= MAX_ALERTS:
        r.bad("alerts", f"must be a list of 1 to {MAX_ALERTS} alerts")
        alerts = []
    parsed = []
    for k, a in enumerate(alerts):
        where = f"alerts[{k}]"
        if not isinstance(a, dict):
            r.bad(where, "must be an object")
            continue
        before = len(r.errors)
        status = a.get("status")
        if status not in STATUSES:
            r.bad(f"{where}.status", "must be firing or resolved")
        labels = r.pairs(a, "labels", f"{where}.labels", required=True)
        annotations = r.pairs(a, "annotations", f"{where}.annotations", required=False)
        starts = r.time(a, "startsAt", f"{where}.startsAt", required=True)
        ends = r.time(a, "endsAt", f"{where}.endsAt", required=False)
        url = r.text(a, "generatorURL", f"{where}.generatorURL", required=False)
        fingerprint = a.get("fingerprint")
        if not isinstance(fingerprint, str) or not FINGERPRINT.match(fingerprint):
            r.bad(f"{where}.fingerprint", "must be 1 to 64 letters or digits")
        if len(r.errors) == before:
            parsed.append(ParsedAlert(status, labels, annotations, starts, ends, url, fingerprint))
    if r.errors:
        raise InvalidAlerts(r.errors)
    return parsed


# --- labels -> node and fault -----------------------------------------------------


@dataclass(frozen=True)
class Mapping:
    node_label: str  # "" when none of the node labels is present
    fault: str | None  # None: ignored
    xid: int | None
    rule: str


PORT = re.compile(r":\d{1,5}\Z")
XID_VALUE = re.compile(r"\A\s*(\d{1,10})(\.0*)?\s*\Z")
# An ECC alert: "ECC", or "Ecc"/"ecc" standing as a word or a camelCase part
# ("GpuEccErrors", "ecc_errors"; not "NodeSuccess", not "Eccentric").
ECC = re.compile(r"ECC|Ecc(?![a-z])|(?<![A-Za-z])ecc(?![a-z])")
NETWORK = re.compile(r"nccl|network|infiniband|rdma|roce", re.IGNORECASE)
NODE_DOWN = frozenset({"nodedown", "instancedown", "hostdown"})


def _builtin(labels: dict[str, str]) -> tuple[str, str] | None:
    """(fault, rule) by the built-in rules: DCGM exporter's Xid and ECC alerts,
    node-exporter's node down, NCCL and network alerts."""
    name = labels.get("alertname", "")
    values = set(labels.values())
    if "xid" in name.lower() or "DCGM_FI_DEV_XID_ERRORS" in values:
        return "gpu_xid", "builtin:dcgm_xid"
    if ECC.search(name) or any(v.startswith("DCGM_FI_DEV_ECC_DBE") for v in values):
        return "ecc", "builtin:dcgm_ecc"
    if name.lower() in NODE_DOWN or "up" in (labels.get("__name__"), labels.get("metric")):
        return "dead_node", "builtin:node_down"
    if NETWORK.search(name):
        return "network", "builtin:network"
    return None


def _xid(labels: dict[str, str], annotations: dict[str, str]) -> int | None:
    for v in (
        labels.get("xid"),
        labels.get("err_code"),
        annotations.get("value"),
        labels.get("value"),
    ):
        m = XID_VALUE.match(v or "")
        if m and int(m.group(1)) < 2**31:
            return int(m.group(1))
    return None


def _rule_matches(rule: dict, labels: dict[str, str]) -> bool:
    """Every matcher of the rule matches in full (a missing label reads as "", as in
    Alertmanager's matchers)."""
    return all(
        re.fullmatch(pattern, labels.get(label, "")) for label, pattern in rule["match"].items()
    )


def alert_map(labels: dict[str, str], annotations: dict[str, str], cfg: dict) -> Mapping:
    """Where an alert points and what fault it stands for, by the cluster's settings."""
    node_label = ""
    for name in cfg["alerts.node_labels"]:
        if labels.get(name):
            node_label = PORT.sub("", labels[name])
            break
    fault, rule, xid = None, "", None
    override = labels.get(OVERRIDE_LABEL)
    if override in FAULT_WORDS or override == IGNORE:
        fault, rule = override, f"label:{OVERRIDE_LABEL}"
    else:
        for k, r in enumerate(cfg["alerts.rules"]):
            if _rule_matches({"match": {}, **r}, labels):
                fault, rule, xid = (
                    r["fault"],
                    f"rules[{k}]" + (f":{r['name']}" if r.get("name") else ""),
                    r.get("xid"),
                )
                break
        else:
            found = _builtin(labels)
            if found is not None:
                fault, rule = found
            else:
                fault, rule = cfg["alerts.unmatched"], "unmatched"
    if fault == IGNORE:
        fault = None
    if fault == "gpu_xid" and xid is None:
        xid = _xid(labels, annotations)
    return Mapping(node_label, fault, xid if fault == "gpu_xid" else None, rule)


def _settings_in_force(cluster: Cluster) -> dict:
    """The cluster's alert settings; a value that no longer passes the checks (edited
    in the admin) is logged and its default used."""
    cfg = alert_settings(cluster_id=cluster.pk)
    for name in list(cfg):
        _, reason = alert_setting_check(name, cfg[name])
        if reason:
            logger.error(
                "alert setting %s of %s is invalid (%s): default used", name, cluster, reason
            )
            cfg[name] = ALERT_DEFAULTS[name]
    return cfg


def _nodes(cluster: Cluster, names: set[str]) -> dict[str, Node]:
    """The cluster's nodes as ingest names them, by the name an alert gave; a fully
    qualified name that names no node finds its short name. One query."""
    short = {n: n.split(".", 1)[0] for n in names}
    found = {
        n.name: n
        for n in Node.objects.filter(cluster=cluster, name__in=names | set(short.values()))
    }
    return {
        n: found.get(n) or found.get(short[n]) for n in names if n in found or short[n] in found
    }


# --- receiving ----------------------------------------------------------------------


@dataclass
class Receipt:
    alert: Alert
    what: str  # "new", "resolved", "repeat"


@dataclass
class _Reported:
    """The fault events of the new firing alerts, stored together."""

    events: list[WireEvent] = field(default_factory=list)
    by_alert: list[tuple[Alert, TrainingJob, int, str]] = field(default_factory=list)


def alerts_receive(*, cluster: Cluster, alerts: list[ParsedAlert], now=None) -> list[Receipt]:
    """Record a delivery's alerts and act on what is new (see the module's docstring)."""
    now = now or timezone.now()
    cfg = _settings_in_force(cluster)
    firsts: dict[tuple[str, float], ParsedAlert] = {}
    for parsed in alerts:  # the same alert twice in one delivery: the first counts
        firsts.setdefault((parsed.fingerprint, parsed.starts_at), parsed)
    unique = list(firsts.values())
    receipts = []
    with transaction.atomic():
        # One cluster's deliveries take turns (an HA pair of Alertmanagers sends each
        # group twice, at once). NO KEY: ingest's inserts referencing it go on.
        Cluster.objects.select_for_update(no_key=True).get(pk=cluster.pk)
        stored = {
            (a.fingerprint, a.starts_at): a
            for a in Alert.objects.filter(
                cluster=cluster, fingerprint__in={p.fingerprint for p in unique}
            ).select_related("node")
        }
        # What is new, mapped; its nodes, and the nodes of the repeats of firing faults,
        # with their launches read once for the delivery.
        mapped = {
            id(p): alert_map(p.labels, p.annotations, cfg)
            for p in unique
            if (p.fingerprint, dt(p.starts_at)) not in stored
        }
        nodes = _nodes(cluster, {m.node_label for m in mapped.values() if m.node_label})
        nodes.update(
            (a.node.name, a.node)
            for a in stored.values()
            if a.status == Alert.Status.FIRING and a.fault_type and a.node
        )
        launches = nodes_running_launches(nodes=list(nodes.values())) if nodes else {}
        reported = _Reported()
        for parsed in unique:
            record = stored.get((parsed.fingerprint, dt(parsed.starts_at)))
            if record is None:
                mapping = mapped[id(parsed)]
                node = nodes.get(mapping.node_label)
                on_node = launches.get(node.pk, []) if node is not None else []
                record = _record_new(cluster, parsed, mapping, node, on_node, now, reported)
                receipts.append(Receipt(record, "new"))
            elif record.status == Alert.Status.FIRING and parsed.status == "resolved":
                _resolve(record, parsed, now)
                receipts.append(Receipt(record, "resolved"))
            else:  # a repeat (repeat_interval), or a late firing after the resolve
                Alert.objects.filter(pk=record.pk).update(
                    receipts=F("receipts") + 1, last_received_at=now
                )
                record.refresh_from_db(fields=["receipts", "last_received_at"])  # node kept
                if record.status == Alert.Status.FIRING and record.fault_type and record.node:
                    _report_to_newcomers(record, parsed, launches.get(record.node_id, []), reported)
                receipts.append(Receipt(record, "repeat"))
        if reported.events:
            _report(cluster, reported)
    return receipts


def _record_new(
    cluster, parsed: ParsedAlert, mapping: Mapping, node, on_node, now, reported: _Reported
) -> Alert:
    """A new alert's record; the fault events of a firing one for the launches on its
    node (`on_node`), or its node marked suspect when there are none."""
    firing = parsed.status == "firing"
    record = Alert(
        cluster=cluster,
        fingerprint=parsed.fingerprint,
        starts_at=dt(parsed.starts_at),
        ends_at=None if parsed.ends_at is None else dt(parsed.ends_at),
        status=parsed.status,
        alertname=parsed.labels.get("alertname", "")[:200],
        labels=parsed.labels,
        annotations=parsed.annotations,
        generator_url=parsed.generator_url[:1000],
        node_label=mapping.node_label[:200],
        node=node,
        fault_type=mapping.fault or "",
        xid=mapping.xid,
        rule=mapping.rule[:100],
        first_received_at=now,
        last_received_at=now,
        resolved_received_at=None if firing else now,
    )
    launches = []
    if not firing:
        record.outcome = Alert.Outcome.RESOLVED_FIRST  # its firing never reached us
    elif mapping.fault is None:
        record.outcome = Alert.Outcome.IGNORED
    elif not mapping.node_label:
        record.outcome = Alert.Outcome.NO_NODE
    elif node is None:
        record.outcome = Alert.Outcome.UNKNOWN_NODE
    else:
        launches = on_node
        record.outcome = Alert.Outcome.INCIDENT if launches else Alert.Outcome.NO_JOB
    for job, attempt in launches:
        _fault_event(record, parsed, job, attempt, reported)
    record.save()
    if record.outcome == Alert.Outcome.NO_JOB:
        node_mark_suspect(node_id=node.pk)  # no change unless it was active
    return record


def _fault_event(record: Alert, parsed: ParsedAlert, job, attempt, reported: _Reported) -> None:
    """The alert's fault as a wire event of the launch `attempt` of `job` on its node."""
    event_id = f"alert:{parsed.fingerprint}:{round(parsed.starts_at * 1000)}"
    started = attempt.started_at.timestamp() if attempt.started_at else parsed.starts_at
    reported.events.append(
        WireEvent(
            index=len(reported.events),
            client_id=event_id,
            job=job.key,
            kind="fault",
            # A fault that began before this launch was there from its start.
            ts=max(parsed.starts_at, started),
            attempt=attempt.number,
            node=record.node.name,
            rank=None,
            data=_fault_data(record, parsed),
        )
    )
    record.events.append({"job": job.key, "event": event_id})
    reported.by_alert.append((record, job, attempt.number, event_id))


def _report_to_newcomers(record: Alert, parsed: ParsedAlert, on_node, reported) -> None:
    """A repeat of a firing fault: the jobs that started on its node since it was last
    heard of get the fault too (a scheduler may place a job on a node the alert made
    suspect); those it was reported to already are left as they are."""
    told = {e["job"] for e in record.events}
    newcomers = [(job, attempt) for job, attempt in on_node if job.key not in told]
    if not newcomers:
        return
    for job, attempt in newcomers:
        _fault_event(record, parsed, job, attempt, reported)
    record.outcome = Alert.Outcome.INCIDENT
    record.save(update_fields=["events", "outcome"])


def _fault_data(record: Alert, parsed: ParsedAlert) -> dict:
    note = parsed.annotations.get("summary") or parsed.annotations.get("description") or ""
    message = f"Alertmanager {record.alertname or record.fingerprint}" + (
        f": {note}" if note else ""
    )
    data = {
        "type": record.fault_type,
        "message": message[:MESSAGE_MAX],
        "alert": record.fingerprint,
    }
    if record.xid is not None:
        data["xid"] = record.xid
    return data


def _report(cluster: Cluster, reported: _Reported) -> None:
    """Store the new faults as the jobs' own, run the quick detection pass of each job,
    and note the alert on the incident each fault opened or joined."""
    events_ingest(cluster=cluster, events=reported.events)
    jobs = {job.pk: job for _, job, _, _ in reported.by_alert}
    for job in jobs.values():
        # A pass that fails is reported by the service; the follow-up passes open it.
        incidents_detect_pass(job=job, inferred=False)
    of_job = {pk: _launch_fault_incidents(job) for pk, job in jobs.items()}
    for record, job, number, event_id in reported.by_alert:
        found = of_job[job.pk]
        incident = _with_event(found, event_id) or _open_of_launch(found, number)
        if incident is None:
            continue
        record.incidents.add(incident)
        _timeline(incident, record, "firing", record.starts_at)


def _launch_fault_incidents(job: TrainingJob) -> list[Incident]:
    return list(Incident.objects.filter(job=job, detector=LAUNCH_FAULT).order_by("-id"))


def _with_event(incidents: list[Incident], event_id: str) -> Incident | None:
    """The incident whose evidence holds the fault event."""
    return next((i for i in incidents if event_id in i.evidence), None)


def _open_of_launch(incidents: list[Incident], number: int) -> Incident | None:
    """The launch's unresolved incident the fault joined (the quick pass opens, it does
    not update evidence: the full pass adds the fault to it)."""
    candidates = [
        i for i in incidents if i.attempt == number and i.state != Incident.State.RESOLVED
    ]
    return max(candidates, key=lambda i: (i.fault_at, i.id), default=None)


def _resolve(record: Alert, parsed: ParsedAlert, now) -> None:
    """The alert cleared: note it on its incidents and resolve those it alone stands behind."""
    record.status = Alert.Status.RESOLVED
    record.ends_at = dt(parsed.ends_at) if parsed.ends_at is not None else now
    record.resolved_received_at = record.last_received_at = now
    record.receipts += 1
    record.save(
        update_fields=["status", "ends_at", "resolved_received_at", "last_received_at", "receipts"]
    )
    ours = {e["event"] for e in record.events}
    incidents = {i.pk: i for i in record.incidents.all()}
    for e in record.events:  # and those a later pass put the fault in
        found = _incident_of_key(e["job"], e["event"])
        if found is not None and found.pk not in incidents:
            incidents[found.pk] = found
            record.incidents.add(found)
    for incident in incidents.values():
        _timeline(incident, record, "resolved", record.ends_at)
        if incident.state == Incident.State.RESOLVED:
            continue
        others = [e for e in incident.evidence if e not in ours]
        if others:
            timeline_entry_add(
                incident_id=incident.pk,
                kind=TimelineEntry.Kind.NOTE,
                at=now,
                actor=ACTOR,
                source=ACTOR,
                message=(
                    f"Alert {record.alertname or record.fingerprint} resolved; the incident"
                    f" stays {incident.state}: {len(others)} other signal(s) stand behind it"
                ),
                data={"fingerprint": record.fingerprint, "other_evidence": others[:20]},
            )
        else:
            incident_resolve(
                incident=incident,
                actor=ACTOR,
                note=f"alert {record.alertname or record.fingerprint} resolved",
            )


def _incident_of_key(job_key: str, event_id: str) -> Incident | None:
    job = TrainingJob.objects.filter(key=job_key).first()
    return None if job is None else _with_event(_launch_fault_incidents(job), event_id)


def _timeline(incident: Incident, record: Alert, status: str, at) -> None:
    """Every receipt on the incident's timeline, as a signal from Alertmanager."""
    xid = f", Xid {record.xid}" if record.xid is not None else ""
    where = f" on {record.node.name}" if record.node_id else ""
    note = record.annotations.get("summary") or record.annotations.get("description") or ""
    timeline_entry_add(
        incident_id=incident.pk,
        kind=TimelineEntry.Kind.SIGNAL,
        at=at,
        actor=ACTOR,
        source=ACTOR,
        message=(
            f"Alertmanager: {record.alertname or record.fingerprint} {status}{where}"
            f" ({record.fault_type}{xid})" + (f": {note[:300]}" if note else "")
        ),
        data={
            "fingerprint": record.fingerprint,
            "status": status,
            "alert": record.pk,
            "labels": record.labels,
        },
    )
