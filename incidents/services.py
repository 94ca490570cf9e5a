"""Writes of the incidents app: open and update incidents from what the detectors
find (incidents.detectors), keep their timelines and figures, the wall-clock
sweep, and what people do to an incident (resolve, notes).

An incident is unique on (job, detector, episode) and every pass updates it to
what the events now say, so a trace posted late, twice or shuffled gives the
same incidents.

(Long module: about 530 lines, one incident's writes from opening to resolving, kept in one
place; what is only read or computed lives in incidents.detectors and .figures.)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from common.time import dt
from incidents import figures, selectors, signals
from incidents.detectors import episodes, job_findings
from incidents.detectors.base import Finding, Signal, signal_where
from incidents.detectors.engine import watch_job
from incidents.detectors.straggler import STRAGGLER
from incidents.models import DetectorState, Incident, SweepState, TimelineEntry
from incidents.settings import detector_settings
from jobs.accounting import compute_ledger, load_lifecycle, load_steps
from jobs.models import Cluster, Node, TrainingJob
from jobs.services import job_recent_cached, node_mark_suspect, recent_read

logger = logging.getLogger(__name__)


def incidents_detect(
    *, job: TrainingJob, inferred: bool = True, clock: float | None = None
) -> list[Incident]:
    """Open or update the job's incidents from what it reported (faults, launches).

    With `inferred` off, only reported faults and launches count: a pass that
    costs the same however long the job, so a reported fault opens its incident
    at once; the full pass that follows may then name an earlier inferred
    fault (a hang) as the one that started the episode.
    Returns the incidents that were opened or changed by this pass.
    """
    # Read first, outside the job's lock (ingest takes it): the inferred part reads
    # what was stored since the last pass. The settings are read once for the pass.
    cfg = detector_settings(job)
    watch = watch_job(job, cfg, clock=clock) if inferred else None
    findings = job_findings(job=job, cfg=cfg, watch=watch)
    changed: list[tuple[Incident, str]] = []
    failures: list[str] = []
    with transaction.atomic():
        TrainingJob.objects.select_for_update().filter(pk=job.pk).first()
        existing = {
            (i.detector, i.episode): i
            for i in Incident.objects.filter(job=job).prefetch_related("nodes")
        }
        for finding in findings:
            if not _to_apply(finding, existing, inferred):
                continue  # unchanged: not even a savepoint
            if _judged_on_less(finding, existing, watch):
                continue
            try:
                # One finding that cannot be stored (a value beyond a column) spoils no other.
                with transaction.atomic():
                    outcome = _apply_finding(job, finding, existing, inferred)
            except DatabaseError as exc:
                failures.append(f"{finding.detector} {finding.episode}: {exc!r}")
                continue
            if outcome is not None:
                changed.append(outcome)
        _announce(changed)
    _record_pass(job, failures)
    named = {n.name for i, _ in changed if i.detector != REPEAT_OFFENDER for n in i.nodes.all()}
    if named:
        repeat = incidents_detect_repeat_offenders(job=job, nodes=named, cfg=cfg)
        changed += [(i, "") for i in repeat]
    return [i for i, _ in changed]


def _judged_on_less(finding, existing, watch) -> bool:
    """A straggler judged on fewer windows than its incident was: a state rebuilt after
    storage upkeep rolled raw windows up (EngineState.partial) leaves it as it is."""
    return (
        watch is not None
        and watch.partial
        and finding.detector == STRAGGLER
        and (finding.detector, finding.episode) in existing
    )


def _to_apply(finding, existing, inferred) -> bool:
    """Whether the finding opens an incident or changes one (what _apply_finding does)."""
    incident = existing.get((finding.detector, finding.episode))
    if incident is None:
        return True
    return inferred and any(getattr(incident, k) != v for k, v in finding.fields.items())


def _apply_finding(job, finding, existing, inferred) -> tuple[Incident, str] | None:
    """Open the finding's incident, or bring it up to what the events now say."""
    incident = existing.get((finding.detector, finding.episode))
    if incident is None:
        incident = Incident.objects.create(
            job=job,
            cluster_id=job.cluster_id,
            detector=finding.detector,
            episode=finding.episode,
            **finding.fields,
        )
        _set_nodes(incident, job, finding.nodes)
        _timeline_for_new(incident, finding.signals)
        if incident.fault_type == "dead_node":
            _suspect_nodes(incident)
        return incident, "opened"
    if not inferred:
        return None  # the quick pass only opens; the full pass keeps incidents current
    known = set(incident.evidence)
    updates = {k: v for k, v in finding.fields.items() if getattr(incident, k) != v}
    if not updates:
        return None
    _attribution_entry(incident, updates, finding)
    for k, v in updates.items():
        setattr(incident, k, v)
    incident.save(update_fields=list(updates))
    _set_nodes(incident, job, finding.nodes)
    for sig in finding.signals:
        if sig.client_id not in known:
            _signal_entry(incident, sig)
    return incident, "updated"


def _record_pass(job: TrainingJob, failures: list[str]) -> None:
    """Report what a pass could not judge (logged at ERROR with the job, and kept on
    the job's detector state for operators); a clean pass clears it."""
    fields: dict = {}
    if failures:
        failure = "; ".join(failures)[:2000]
        logger.error("detection for job %s (id %s) failed: %s", job.key, job.pk, failure)
        fields.update(failed_at=timezone.now(), failure=failure)
    elif DetectorState.objects.filter(job=job, failed_at__isnull=False).exists():
        fields.update(failed_at=None, failure="")
    if fields:
        DetectorState.objects.update_or_create(job=job, defaults=fields)


def incidents_detect_pass(
    *, job: TrainingJob, inferred: bool = True, clock: float | None = None
) -> list[Incident] | None:
    """A detection pass (then the figures of what it changed) that cannot take the
    caller down: a pass that fails is reported (see _record_pass) and returns None;
    the next events or the next sweep run it again, not a retry loop."""
    began = time.monotonic()
    try:
        with transaction.atomic():  # a database error here leaves the caller's transaction whole
            changed = incidents_detect(job=job, inferred=inferred, clock=clock)
            if changed and inferred:
                incidents_update_figures(job=job)
    except Exception as exc:
        logger.exception("detection pass for job %s (id %s) failed", job.key, job.pk)
        try:
            _record_pass(job, [f"pass: {exc!r}"])
        except Exception:
            logger.exception("could not record the failed pass of job %s", job.key)
        return None
    if inferred:  # how long a full pass takes for this job: the receivers space passes by it
        DetectorState.objects.update_or_create(
            job=job, defaults={"last_pass_s": time.monotonic() - began}
        )
    return changed


REPEAT_OFFENDER = "repeat_offender"


def incidents_detect_repeat_offenders(
    *, job: TrainingJob, nodes: set[str], cfg: dict | None = None
) -> list[Incident]:
    """A node named in several incidents of its cluster within a window (default 3 in
    7 days) gets one incident recommending it be taken out of service, opened on
    the job where the last of them happened. After such an incident is resolved,
    only incidents opened since count towards the next one. `cfg`: the job's detector
    settings, when the caller's pass has read them."""
    cfg = cfg if cfg is not None else detector_settings(job)
    count, window_s = int(cfg["repeat_offender.incidents"]), float(cfg["repeat_offender.window_s"])
    opened = []
    for name in sorted(nodes):
        named = Incident.objects.filter(cluster_id=job.cluster_id, nodes__name=name)
        since = (
            named.filter(detector=REPEAT_OFFENDER, resolved_at__isnull=False)
            .order_by("-resolved_at")
            .values_list("resolved_at", flat=True)
            .first()
        )
        history = named.exclude(detector=REPEAT_OFFENDER).select_related("job")
        if since is not None:  # both on the server's clock
            history = history.filter(opened_at__gt=since)
        history = list(history.order_by("fault_at", "id"))
        for i in range(count - 1, len(history)):
            first, last = history[i - count + 1], history[i]
            if (last.fault_at - first.fault_at).total_seconds() > window_s:
                continue
            members = history[i - count + 1 : i + 1]
            causes = [m.cause for m in members]
            with transaction.atomic():
                incident, created = Incident.objects.get_or_create(
                    job=last.job,
                    detector=REPEAT_OFFENDER,
                    episode=f"node-{name}-{first.pk}",
                    defaults={
                        "cluster_id": job.cluster_id,
                        "cause": max(set(causes), key=causes.count),
                        "fault_type": "repeat_offender",
                        "severity": Incident.Severity.CRITICAL,
                        "summary": (
                            f"{name} was in {count} incidents within"
                            f" {window_s / 86400:g} days: take it out of service"
                        ),
                        "evidence": [f"incident:{m.pk}" for m in members],
                        "fault_at": last.fault_at,
                        "detected_at": last.detected_at,
                    },
                )
                if created:
                    _set_nodes(incident, last.job, [name])
                    _timeline_for_new(incident, [])
                    _announce([(incident, "opened")])
                    opened.append(incident)
            break  # one per node until it is resolved
    return opened


def _suspect_nodes(incident: Incident) -> None:
    for node in incident.nodes.all():
        if node_mark_suspect(node_id=node.id):
            TimelineEntry.objects.create(
                incident=incident,
                kind=TimelineEntry.Kind.STATE_CHANGE,
                at=timezone.now(),
                actor=f"detector:{incident.detector}",
                source="rebound",
                message=f"node {node.name}: active → suspect",
                data={"node": node.name, "from": "active", "to": "suspect"},
            )


def _set_nodes(incident: Incident, job: TrainingJob, names: list[str]) -> None:
    if names:
        incident.nodes.set(Node.objects.filter(cluster_id=job.cluster_id, name__in=names))
    else:
        incident.nodes.clear()


def _signal_entry(incident: Incident, s: Signal) -> None:
    if s.kind == "fault" and "silent_s" in s.data:
        what = f"{s.node} sent no heartbeat for {s.data['silent_s']:.0f} s"
    elif s.kind == "fault" and "no_step_s" in s.data:
        what = f"no step after step {s.data['last_step']} for {s.data['no_step_s']:.0f} s"
    elif s.kind == "fault":
        what = s.data.get("type")
    elif s.kind == "attempt_ended":
        what = f"launch {s.attempt} ended {s.data.get('reason')}"
    else:
        what = f"launch {s.attempt} started"
    where = signal_where(s)
    TimelineEntry.objects.create(
        incident=incident,
        kind=TimelineEntry.Kind.SIGNAL,
        at=dt(s.ts),
        actor=f"job:{incident.job.key}",
        source=s.kind,
        message=f"{what}{f' ({where})' if where else ''}",
        data={"event": s.client_id, **s.data},
    )


ATTRIBUTION = ("cause", "fault_type", "xid")


def _attribution_entry(incident: Incident, updates: dict, finding: Finding) -> None:
    """A timeline entry for a change of what the incident is put down to: from, to, why.
    It stands just after the newest of the signals that changed it (written next, in
    the same pass), or at the pass's time when none is new."""
    changed = [k for k in ATTRIBUTION if k in updates]
    if not changed:
        return
    before = {k: getattr(incident, k) for k in ATTRIBUTION}
    after = {**before, **{k: updates[k] for k in changed}}

    def said(v: dict) -> str:
        xid = f", Xid {v['xid']}" if v["xid"] is not None else ""
        return f"{v['cause']} ({v['fault_type']}{xid})"

    why = finding.why or "the episode's signals now point there"
    symptoms = episodes.SYMPTOM_TYPES
    if before["fault_type"] in symptoms and after["fault_type"] not in symptoms:
        why += f"; {before['fault_type']} is a symptom (a peer failed or hung), not a cause"
    known = set(incident.evidence)
    new = [s.ts for s in finding.signals if s.client_id not in known]
    TimelineEntry.objects.create(
        incident=incident,
        kind=TimelineEntry.Kind.DETECTION,
        # A microsecond after the newest signal's own time (as its entry stores it).
        at=dt(max(new)) + timedelta(microseconds=1) if new else timezone.now(),
        actor=f"detector:{incident.detector}",
        source="rebound",
        message=f"Re-attributed: {said(before)} → {said(after)}: {why}",
        data={k: {"from": before[k], "to": after[k]} for k in changed} | {"why": why},
    )


def _timeline_for_new(incident: Incident, signals_: list[Signal]) -> None:
    for sig in signals_:
        _signal_entry(incident, sig)
    TimelineEntry.objects.create(
        incident=incident,
        kind=TimelineEntry.Kind.DETECTION,
        at=incident.detected_at,
        actor=f"detector:{incident.detector}",
        source="rebound",
        message=f"Opened: {incident.summary} ({incident.cause}, {incident.severity})",
    )


def _announce(changed: list[tuple[Incident, str]]) -> None:
    for incident, what in changed:
        signal = signals.incident_opened if what == "opened" else signals.incident_updated
        transaction.on_commit(
            lambda s=signal, i=incident: s.send(sender=Incident, incident=i), robust=True
        )


# --- the sweep -------------------------------------------------------------------

SWEEP_EVERY_S = 15
SILENT_AFTER_S = 30  # a running job's reporters send something every few seconds
HEARD_WITHIN_S = 3600  # a node heard from this recently is expected to go on


@dataclass
class SweepResult:
    judged: list[str] = field(default_factory=list)  # silent jobs, judged on a moved clock
    suspect: list[str] = field(default_factory=list)  # nodes that fell silent
    changed: list[Incident] = field(default_factory=list)  # opened or updated by it
    deaf: list[str] = field(default_factory=list)  # clusters nothing arrives from
    failed: list[str] = field(default_factory=list)  # jobs whose pass failed (reported)


def incidents_sweep(*, now=None) -> SweepResult:
    """Wall-clock checks for what a job's own clock cannot show: that it went silent.

    A running job from which nothing arrived for SILENT_AFTER_S is judged with its
    clock moved on by the silence, so a hang or dead nodes show; an active node not
    heard from for longer than its dead-node timeout becomes suspect (an incident
    when it hosts a running job, from that job's pass). Not judged: a cluster from
    which nothing at all arrives (the path to it or the console's own ingest
    failed: the jobs are not silent, the console is deaf), and silences older than
    the sweep's own unbroken run (the console was down then).
    """
    now = now or timezone.now()
    result = SweepResult()
    previous = SweepState.objects.filter(pk=1).first()
    unbroken = previous is not None and (now - previous.at).total_seconds() <= 3 * SWEEP_EVERY_S
    since_at = previous.since if unbroken else now
    SweepState.objects.update_or_create(pk=1, defaults={"at": now, "since": since_at})
    since = since_at.timestamp()
    if not unbroken:
        return result  # nothing is known yet of what happened before this run began
    heard = now - timedelta(seconds=SILENT_AFTER_S)
    # A node's last_heard_at may lag what arrived by up to this (see ingest).
    stale = timedelta(seconds=settings.REBOUND_NODE_LIVENESS_S)
    for cluster in Cluster.objects.all():
        jobs = TrainingJob.objects.filter(cluster=cluster, status=TrainingJob.Status.RUNNING)
        nodes = Node.objects.filter(cluster=cluster)
        alive = (
            jobs.filter(last_received_at__gte=heard).exists()
            or nodes.filter(last_heard_at__gte=heard - stale).exists()
        )
        silent_jobs = jobs.filter(last_received_at__lt=heard, last_received_at__gte=dt(since))
        if not alive:
            if silent_jobs.exists():
                result.deaf.append(cluster.name)
            continue
        timeout = float(detector_settings(None, cluster_id=cluster.pk)["dead_node.timeout_s"])
        quiet = nodes.filter(
            state=Node.State.ACTIVE,
            last_heard_at__lt=now - timedelta(seconds=timeout) - stale,
            last_heard_at__gte=max(now - timedelta(seconds=HEARD_WITHIN_S), dt(since)),
        )
        for node in quiet:
            if node_mark_suspect(node_id=node.pk):
                result.suspect.append(node.name)
        for job in silent_jobs.exclude(last_event_ts=None):
            silent_s = (now - job.last_received_at).total_seconds()
            # One job whose pass fails (reported there) stops no other job's.
            changed = incidents_detect_pass(job=job, clock=job.last_event_ts + silent_s)
            if changed is None:
                result.failed.append(job.key)
                continue
            result.judged.append(job.key)
            result.changed += changed
    return result


# --- figures -------------------------------------------------------------------


def incidents_update_figures(*, job: TrainingJob, ledger=None, steps=None) -> list[Incident]:
    """Times to resume and recover, and lost GPU-seconds, of the job's incidents.

    All of them, recovered or not: events may arrive late and out of order, and
    the figures follow what is stored. A launch's last episode carries the
    launch's failure (its lost GPU-seconds); an earlier one, after which
    training went on in the same launch, resumed and recovered within it.
    """
    pending = list(Incident.objects.filter(job=job).exclude(attempt=None))
    last_of_launch: dict[int, Incident] = {}
    for incident in pending:
        latest = last_of_launch.get(incident.attempt)
        if latest is None or incident.fault_at > latest.fault_at:
            last_of_launch[incident.attempt] = incident
    if not pending:
        return []
    if ledger is None or steps is None:
        steps = load_steps(job.id)
        ledger = compute_ledger(
            job.key, load_lifecycle(job.id), steps, last_event_ts=job.last_event_ts
        )
    order = {launch.number: k for k, launch in enumerate(ledger.launches)}
    changed = []
    with transaction.atomic():
        for incident in pending:
            k = order.get(incident.attempt)
            if k is None:
                continue
            survived = figures.survived(incident, ledger.launches[k], steps)
            if incident is last_of_launch[incident.attempt] and not survived:
                updates = figures.launch_failure_figures(incident, ledger.launches, k, steps)
            else:
                updates = figures.in_launch_figures(incident, ledger.launches[k], steps)
            updates = {f: v for f, v in updates.items() if getattr(incident, f) != v}
            if not updates:
                continue
            recovered_now = "recovered_at" in updates and incident.state in Incident.OPEN_STATES
            for f, v in updates.items():
                setattr(incident, f, v)
            if recovered_now:
                _change_state(
                    incident,
                    Incident.State.RECOVERED,
                    actor="rebound",
                    why=("training passed the highest step reached before the fault"),
                    at=incident.recovered_at,
                )
                updates["state"] = incident.state
            incident.save(update_fields=list(updates))
            # Its figures (and perhaps its state) changed; recovery's receiver does
            # nothing for an incident no longer open.
            transaction.on_commit(
                lambda i=incident: signals.incident_updated.send(sender=Incident, incident=i),
                robust=True,
            )
            changed.append(incident)
    return changed


def _change_state(incident: Incident, to: str, *, actor: str, why: str, at=None) -> None:
    TimelineEntry.objects.create(
        incident=incident,
        kind=TimelineEntry.Kind.STATE_CHANGE,
        at=at or timezone.now(),
        actor=actor,
        source="rebound",
        message=f"{incident.state} → {to}: {why}",
        data={"from": incident.state, "to": to},
    )
    incident.state = to


def incident_resolve(*, incident: Incident, actor: str, note: str = "") -> Incident:
    """Close an incident; resolving it again changes nothing."""
    with transaction.atomic():
        incident = Incident.objects.select_for_update().get(pk=incident.pk)
        if incident.state == Incident.State.RESOLVED:
            return incident
        now = timezone.now()
        _change_state(
            incident, Incident.State.RESOLVED, actor=actor, why=note or "resolved", at=now
        )
        incident.resolved_at = now
        incident.save(update_fields=["state", "resolved_at"])
        transaction.on_commit(
            lambda: signals.incident_resolved.send(sender=Incident, incident=incident),
            robust=True,
        )
    return incident


def incident_update_notes(
    *, incident: Incident, actor: str, root_cause: str | None = None, postmortem: str | None = None
) -> Incident:
    changes = {}
    if root_cause is not None and root_cause != incident.root_cause:
        changes["root_cause"] = root_cause
    if postmortem is not None and postmortem != incident.postmortem:
        changes["postmortem"] = postmortem
    if not changes:
        return incident
    with transaction.atomic():
        for f, v in changes.items():
            setattr(incident, f, v)
        incident.save(update_fields=list(changes))
        TimelineEntry.objects.create(
            incident=incident,
            kind=TimelineEntry.Kind.NOTE,
            at=timezone.now(),
            actor=actor,
            source="console",
            message="Edited " + " and ".join(f.replace("_", " ") for f in changes),
            data=changes,
        )
    return incident


def timeline_entry_add(
    *,
    incident_id: int,
    kind: str,
    at,
    actor: str,
    message: str,
    source: str = "",
    data: dict | None = None,
) -> TimelineEntry:
    """Appends an entry to an incident's timeline (the timeline is append-only: other
    apps record what they did to an incident through here)."""
    return TimelineEntry.objects.create(
        incident_id=incident_id,
        kind=kind,
        at=at,
        actor=actor,
        source=source,
        message=message,
        data=data or {},
    )


def job_rank_scores_ensure(*, job: TrainingJob) -> dict:
    """incidents.selectors.job_rank_scores, recent-cached (jobs.services.job_recent_cached):
    the ranks API pages it per request, and 16,384 ranks are worth scoring once."""
    return job_recent_cached(job, "rank-scores")


recent_read("rank-scores")(selectors.job_rank_scores)
