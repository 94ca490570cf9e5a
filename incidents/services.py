"""Writes of the incidents app: open incidents from what jobs report, keep their figures.

Detection works on the job's own clock and re-derives each episode from all
the events stored so far, so a trace posted late, twice or shuffled gives the
same incidents: an incident is unique on (job, detector, episode) and every
pass updates it to what the events now say.

Faults of a launch are one episode: the earliest fault that is not a symptom
(an NCCL timeout on other ranks) initiates it; the other faults and the
launch's end attach to it as signals. A launch that ends failed or killed with
no fault reported is an episode of its own, until a fault for it arrives.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
from django.db import DatabaseError, transaction
from django.utils import timezone

from common.time import dt
from common.vocabulary import FAULT_CAUSES
from incidents import signals
from incidents.models import DetectorState, Incident, SweepState, TimelineEntry
from incidents.settings import detector_settings
from incidents.watch import Signal, Watch, steps_between, watch_job
from incidents.xid import APPLICATION, HARDWARE, xid_class
from jobs.accounting import compute_ledger, load_lifecycle, load_steps
from jobs.models import Checkpoint, Cluster, Event, Node, TrainingJob
from jobs.services import node_mark_suspect

logger = logging.getLogger(__name__)

LAUNCH_FAULT = "launch_fault"
SYMPTOM_TYPES = frozenset({"nccl_timeout"})
FAILED_ENDS = frozenset({"failed", "killed"})

C = Incident.Cause
S = Incident.Severity


def fault_cause(fault_type: str, xid: int | None) -> tuple[str, str]:
    """The cause and severity a fault report points to; an Xid's class decides when present."""
    if xid is not None or fault_type == "gpu_xid":
        klass = xid_class(xid)
        if klass == HARDWARE:
            return C.GPU, S.CRITICAL
        if klass == APPLICATION:
            return C.SOFTWARE, S.MAJOR
        if fault_type == "gpu_xid":
            return C.UNKNOWN, S.MAJOR
    return FAULT_CAUSES.get(fault_type, (C.UNKNOWN, S.MAJOR))


@dataclass
class Episode:
    attempt: int
    signals: list[Signal] = field(default_factory=list)
    index: int = 0  # the launch's first episode is 0; one after training went on, 1, ...

    @property
    def key(self) -> str:
        return f"launch-{self.attempt}" + (f"-{self.index}" if self.index else "")

    @property
    def initiating(self) -> Signal | None:
        faults = sorted((s for s in self.signals if s.kind == "fault"), key=lambda s: s.ts)
        causes = [s for s in faults if s.data.get("type") not in SYMPTOM_TYPES]
        return (causes or faults or [None])[0]

    @property
    def failed_end(self) -> Signal | None:
        """The launch's end, when it failed or was killed unasked (an end someone
        requested, such as a recovery action's relaunch, is no fault)."""
        ends = [s for s in self.signals if s.kind == "attempt_ended"]
        failed = (s for s in ends if s.data.get("reason") in FAILED_ENDS)
        return next((s for s in failed if not s.data.get("requested_by")), None)


def _launch_at(starts: list[tuple[float, int]], ts: float) -> int | None:
    """The launch running at `ts`: the latest one started by then."""
    number = None
    for start, n in starts:
        if start <= ts:
            number = n
    return number


def find_episodes(job: TrainingJob, *, watch: Watch | None = None) -> list[Episode]:
    """The job's fault episodes, launch by launch.

    A launch's signals belong to one episode, started by its earliest fault
    that is not a symptom, unless training went on after it: a new fault after
    `episode.progress_steps` more steps of that launch starts a new episode.
    `watch` adds what detectors inferred from steps, windows and heartbeats
    (hangs, loss trouble, dead nodes) and lets progress be judged. Without it,
    a launch is one episode (the quick pass only opens the first).
    """
    rows = (
        Event.objects.filter(job=job, kind__in=("fault", "attempt_ended", "attempt_started"))
        .order_by("ts", "id")
        .values_list("client_id", "kind", "ts", "attempt", "node", "rank", "data")
    )
    starts: list[tuple[float, int]] = []
    signals_: list[Signal] = []
    for row in rows:
        s = Signal(*row)
        if s.kind == "attempt_started":
            starts.append((s.ts, s.attempt))
        else:
            signals_.append(s)
    starts.sort()
    if watch is not None:
        signals_ += watch.hangs + watch.losses + watch.dead_nodes
    by_launch: dict[int, list[Signal]] = {}
    for s in signals_:
        attempt = s.attempt if s.attempt is not None else _launch_at(starts, s.ts)
        if attempt is None:
            continue  # a node's fault while none of this job's launches ran
        by_launch.setdefault(attempt, []).append(s)
    progress_steps = int(detector_settings(job)["episode.progress_steps"])
    episodes: list[Episode] = []
    for attempt, launch_signals in sorted(by_launch.items()):
        current = Episode(attempt)
        episodes.append(current)
        for s in sorted(launch_signals, key=lambda s: s.ts):
            first = current.initiating
            starts_anew = (
                watch is not None
                and first is not None
                and s.kind == "fault"
                and s.data.get("type") not in SYMPTOM_TYPES
                and s.data.get("type") != first.data.get("type")  # the same trouble again
                and steps_between(job, attempt, first.ts, s.ts, progress_steps) >= progress_steps
            )
            if starts_anew:
                current = Episode(attempt, index=current.index + 1)
                episodes.append(current)
            current.signals.append(s)
    return [e for e in episodes if e.initiating is not None or e.failed_end is not None]


def _episode_fields(episode: Episode) -> dict:
    first = episode.initiating
    if first is not None:
        fault_type = first.data.get("type", "other")
        xid = first.data.get("xid")
        cause, severity = fault_cause(fault_type, xid)
        where = f" on {first.node}" if first.node else ""
        rank = f" rank {first.rank}" if first.rank is not None else ""
        summary = f"{fault_type}{f' (Xid {xid})' if xid is not None else ''}{where}{rank}"
        if "silent_s" in first.data:
            summary += f": no heartbeat for {first.data['silent_s']:.0f} s"
        if "no_step_s" in first.data:
            summary += (
                f": no step for {first.data['no_step_s']:.0f} s after step"
                f" {first.data['last_step']} (timeout {first.data['timeout_s']:.0f} s)"
            )
        nodes = [first.node] if first.node else []
        ranks = [first.rank] if first.rank is not None else _ranks_named(episode, first)
        # The fault began at its earliest sign, though its cause may be reported later
        # (a launch's supervisor reports the rank that died after tearing the launch
        # down, its peers' NCCL timeouts come first); it was known at the first of them.
        faults = [s for s in episode.signals if s.kind == "fault"]
        fault_ts = min(s.ts for s in faults)
        detected_ts = min(s.detected_ts if s.detected_ts is not None else s.ts for s in faults)
    else:
        first = episode.failed_end
        fault_type, xid = "crash", None
        cause, severity = C.UNKNOWN, S.MAJOR
        summary = (
            f"launch {episode.attempt} ended {first.data.get('reason')} with no fault reported"
        )
        nodes, ranks = [], []
        fault_ts = detected_ts = first.ts
    return {
        "attempt": episode.attempt,
        "cause": cause,
        "fault_type": fault_type,
        "xid": xid,
        "severity": severity,
        "summary": summary[:300],
        "ranks": ranks,
        "evidence": [s.client_id for s in episode.signals],
        "fault_at": dt(fault_ts),
        "detected_at": dt(detected_ts),
        "_nodes": nodes,
        "_why": _attribution(episode, first),
    }


def _ranks_named(episode: Episode, first: Signal) -> list[int]:
    """The ranks a fault that names none (a node's Xid) took down: those its episode's
    other faults name on the same node, symptoms (a peer's timeout) left out."""
    return sorted(
        {
            s.rank
            for s in episode.signals
            if s.kind == "fault"
            and s.rank is not None
            and s.data.get("type") not in SYMPTOM_TYPES
            and (first.node is None or s.node == first.node)
        }
    )


def _where(s: Signal) -> str:
    return " ".join(x for x in (s.node, f"rank {s.rank}" if s.rank is not None else "") if x)


def _attribution(episode: Episode, first: Signal) -> str:
    """Why the episode is put down to `first`, in words for its timeline."""
    if first.kind != "fault":
        return f"launch {episode.attempt} ended {first.data.get('reason')} with no fault reported"
    where = f" ({_where(first)})" if _where(first) else ""
    at = dt(first.ts).strftime("%H:%M:%S.%f")[:-3]
    what = f"{first.data.get('type')}{where} at {at} UTC"
    if first.data.get("type") in SYMPTOM_TYPES:
        return f"{what} is the first fault of launch {episode.attempt}; only symptoms so far"
    return f"{what} is the first fault of launch {episode.attempt} that is not a symptom"


@dataclass
class Finding:
    """What a detector found: one episode, as the incident's fields and its signals."""

    detector: str
    episode: str
    fields: dict
    nodes: list[str]
    signals: list[Signal]
    why: str = ""  # why this cause, for the timeline when it changes


def _launch_findings(job: TrainingJob, watch: Watch | None) -> list[Finding]:
    findings = []
    for episode in find_episodes(job, watch=watch):
        fields = _episode_fields(episode)
        nodes, why = fields.pop("_nodes"), fields.pop("_why")
        findings.append(Finding(LAUNCH_FAULT, episode.key, fields, nodes, episode.signals, why))
    return findings


CRASH_LOOP = "crash_loop"


@dataclass
class LaunchRecord:
    number: int
    start: float
    started: Signal
    end: float | None = None
    reason: str = ""
    restored: int = 0  # the checkpoint step it resumed from
    best_saved: int | None = None  # the highest durable checkpoint it saved

    @property
    def progressed(self) -> bool:
        """Completed, or saved a durable checkpoint past the one it started from."""
        return self.reason == "completed" or (
            self.best_saved is not None and self.best_saved > self.restored
        )


def _launch_records(job: TrainingJob) -> list[LaunchRecord]:
    rows = (
        Event.objects.filter(
            job=job, kind__in=("attempt_started", "attempt_ended", "checkpoint_loaded")
        )
        .order_by("ts", "id")
        .values_list("client_id", "kind", "ts", "attempt", "node", "rank", "data")
    )
    records: dict[int, LaunchRecord] = {}
    later: list[Signal] = []
    for row in rows:
        sig = Signal(*row)
        if sig.kind == "attempt_started":
            if sig.attempt not in records:
                records[sig.attempt] = LaunchRecord(sig.attempt, sig.ts, sig)
        else:
            later.append(sig)
    for sig in later:
        r = records.get(sig.attempt)
        if r is None:
            continue
        if sig.kind == "attempt_ended" and r.end is None:
            r.end, r.reason = sig.ts, sig.data.get("reason", "")
        elif sig.kind == "checkpoint_loaded":
            r.restored = sig.data["step"]
    for r in records.values():  # the launch's newest durable checkpoint: an index lookup
        r.best_saved = (
            Checkpoint.objects.filter(job=job, attempt=r.number, durable=True)
            .exclude(saved_at=None)
            .order_by("-step")
            .values_list("step", flat=True)
            .first()
        )
    return sorted(records.values(), key=lambda r: (r.start, r.number))


def _crash_loop_findings(job: TrainingJob, launch_findings: list[Finding]) -> list[Finding]:
    """Launches in a storm (N within a window), or N in a row that never advance the
    checkpoint: restarting will not fix it. One finding per loop; a launch that
    completes or advances the checkpoint ends the loop."""
    cfg = detector_settings(job)
    storm_n, window = int(cfg["crash_loop.launches"]), float(cfg["crash_loop.window_s"])
    stuck_n = int(cfg["crash_loop.no_progress_launches"])
    causes = {f.fields["attempt"]: f.fields["cause"] for f in launch_findings}
    records = _launch_records(job)

    loops: list[tuple[list[LaunchRecord], float, str]] = []
    current: tuple[list[LaunchRecord], float, str] | None = None
    stuck = 0
    for i, r in enumerate(records):
        if current is not None:
            if r.progressed:
                loops.append(current)
                current, stuck = None, 0
            else:
                current[0].append(r)
            continue
        recent = [x for x in records[: i + 1] if x.start >= r.start - window]
        if len(recent) >= storm_n:
            why = f"{len(recent)} launches within {window / 60:.0f} min"
            current = (recent, r.start, why)
        stuck = 0 if r.progressed or r.end is None else stuck + 1
        if current is None and stuck >= stuck_n:
            why = f"{stuck} launches in a row ended without advancing the checkpoint"
            current = (records[i - stuck + 1 : i + 1], r.end, why)
    if current is not None:
        loops.append(current)

    findings = []
    for members, detected, why in loops:
        first = members[0]
        member_causes = [causes[m.number] for m in members if m.number in causes]
        cause = max(set(member_causes), key=member_causes.count) if member_causes else C.UNKNOWN
        fields = {
            "attempt": None,
            "cause": cause,
            "fault_type": "crash_loop",
            "xid": None,
            "severity": S.CRITICAL,
            "summary": f"crash loop from launch {first.number}: {why}"[:300],
            "ranks": [],
            "evidence": [m.started.client_id for m in members],
            "fault_at": dt(first.start),
            "detected_at": dt(detected),
        }
        signals_ = [m.started for m in members]
        why = f"most of the loop's {len(members)} launches failed of {cause}"
        findings.append(Finding(CRASH_LOOP, f"loop-{first.number}", fields, [], signals_, why))
    return findings


STRAGGLER = "straggler"


def _straggler_findings(watch: Watch) -> list[Finding]:
    findings = []
    for s in watch.stragglers:
        scores = {"peer_score": round(s.worst_peer, 3), "own_score": round(s.worst_own, 3)}
        fields = {
            "attempt": None,
            "cause": C.STRAGGLER,
            "fault_type": "straggler",
            "xid": None,
            "severity": S.MAJOR,
            "summary": (
                f"straggler {s.node}: ranks {', '.join(map(str, sorted(s.ranks)))} slow for"
                f" {s.windows} windows from step {s.first_step} (peer score"
                f" {s.worst_peer:.2f}, own {s.worst_own:.2f})"
            )[:300],
            "ranks": sorted(s.ranks),
            "evidence": s.evidence,
            "fault_at": dt(s.first_ts),
            "detected_at": dt(s.detected_ts),
            "lost_gpu_seconds": s.excess_gpu_s,
            "lost_breakdown": {"slowdown": s.excess_gpu_s},
        }
        signal = Signal(
            client_id=s.evidence[0],
            kind="fault",
            ts=s.first_ts,
            attempt=None,
            node=s.node,
            rank=None,
            data={"type": "straggler", **scores},
        )
        findings.append(Finding(STRAGGLER, f"node-{s.node}", fields, [s.node], [signal]))
    return findings


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
    # what was stored since the last pass.
    cfg = detector_settings(job)
    watch = watch_job(job, cfg, clock=clock) if inferred else None
    findings = _launch_findings(job, watch)
    findings += _crash_loop_findings(job, findings)
    if watch is not None:
        findings += _straggler_findings(watch)
    changed: list[tuple[Incident, str]] = []
    failures: list[str] = []
    with transaction.atomic():
        TrainingJob.objects.select_for_update().filter(pk=job.pk).first()
        existing = {
            (i.detector, i.episode): i
            for i in Incident.objects.filter(job=job).prefetch_related("nodes")
        }
        for finding in findings:
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
        changed += [(i, "") for i in incidents_detect_repeat_offenders(job=job, nodes=named)]
    return [i for i, _ in changed]


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


def incidents_detect_repeat_offenders(*, job: TrainingJob, nodes: set[str]) -> list[Incident]:
    """A node named in several incidents of its cluster within a window (default 3 in
    7 days) gets one incident recommending it be taken out of service, opened on
    the job where the last of them happened. After such an incident is resolved,
    only incidents opened since count towards the next one."""
    cfg = detector_settings(job)
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
                        "severity": S.CRITICAL,
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
    where = _where(s)
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
    if before["fault_type"] in SYMPTOM_TYPES and after["fault_type"] not in SYMPTOM_TYPES:
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
    for cluster in Cluster.objects.all():
        jobs = TrainingJob.objects.filter(cluster=cluster, status=TrainingJob.Status.RUNNING)
        nodes = Node.objects.filter(cluster=cluster)
        alive = (
            jobs.filter(last_received_at__gte=heard).exists()
            or nodes.filter(last_heard_at__gte=heard).exists()
        )
        silent_jobs = jobs.filter(last_received_at__lt=heard, last_received_at__gte=dt(since))
        if not alive:
            if silent_jobs.exists():
                result.deaf.append(cluster.name)
            continue
        timeout = float(detector_settings(None, cluster_id=cluster.pk)["dead_node.timeout_s"])
        quiet = nodes.filter(
            state=Node.State.ACTIVE,
            last_heard_at__lt=now - timedelta(seconds=timeout),
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
            survived = _survived(incident, ledger.launches[k], steps)
            if incident is last_of_launch[incident.attempt] and not survived:
                updates = _figures(incident, ledger.launches, k, steps)
            else:
                updates = _in_launch_figures(incident, ledger.launches[k], steps)
            updates = {f: v for f, v in updates.items() if getattr(incident, f) != v}
            if not updates:
                continue
            recovered_now = "recovered_at" in updates and incident.state in (
                Incident.State.OPEN,
                Incident.State.MITIGATING,
            )
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
            signal = signals.incident_recovered if recovered_now else signals.incident_updated
            transaction.on_commit(
                lambda s=signal, i=incident: s.send(sender=Incident, incident=i), robust=True
            )
            changed.append(incident)
    return changed


def _figures(incident: Incident, launches, k: int, steps) -> dict:
    failed = launches[k]
    nxt = launches[k + 1] if k + 1 < len(launches) else None
    fault_ts = incident.fault_at.timestamp()
    later = {launch.number for launch in launches[k + 1 :]}

    resumed_at = recovered_at = None
    if len(steps.ts) and later:
        in_later = np.isin(steps.attempt, list(later))
        if in_later.any():
            resumed_at = dt(float(steps.ts[in_later].min()))
            before = steps.ts <= fault_ts
            highest = int(steps.step[before].max()) if before.any() else -1
            beyond = in_later & (steps.step > highest)
            if beyond.any():
                recovered_at = dt(float(steps.ts[beyond].min()))

    ws = failed.world_size
    breakdown = {
        "wasted_progress": failed.categories["wasted_progress"] * ws,
        "stalled": failed.categories["stalled"] * ws,
        "downtime": failed.gap_after_s * ws,
        "startup": (nxt.categories["startup"] * nxt.world_size) if nxt else 0.0,
        "checkpoint_restore": (nxt.categories["checkpoint_restore"] * nxt.world_size)
        if nxt
        else 0.0,
    }
    return {
        "resumed_at": resumed_at,
        "recovered_at": recovered_at,
        "lost_breakdown": breakdown,
        "lost_gpu_seconds": sum(breakdown.values()),
    }


def _survived(incident: Incident, launch, steps) -> bool:
    """A hang the launch came out of by itself: it completed, or stepped on past it."""
    if incident.fault_type != "hang":
        return False
    fault_ts = incident.fault_at.timestamp()
    return launch.completed or bool(
        ((steps.attempt == incident.attempt) & (steps.ts > fault_ts)).any()
    )


def _in_launch_figures(incident: Incident, launch, steps) -> dict:
    """An episode the launch went on after: it resumed at the launch's next step and
    recovered at its first step past the highest before the fault. Its time stays
    inside steps in the ledger (no badput); what a hang the launch survived cost
    is its stall beyond the launch's usual step interval, x the world size, shown
    as slowdown (as a straggler's cost is)."""
    fault_ts = incident.fault_at.timestamp()
    same = (steps.attempt == incident.attempt) & (steps.ts > fault_ts)
    before = steps.ts <= fault_ts
    highest = int(steps.step[before].max()) if before.any() else -1
    beyond = same & (steps.step > highest)
    resumed = float(steps.ts[same].min()) if same.any() else None
    breakdown = {}
    if incident.fault_type == "hang" and resumed is not None:
        own = np.sort(steps.ts[steps.attempt == incident.attempt])
        usual = float(np.median(np.diff(own))) if len(own) > 2 else 0.0
        breakdown["slowdown"] = max(0.0, resumed - fault_ts - usual) * (launch.world_size or 1)
    return {
        "resumed_at": dt(resumed) if resumed is not None else None,
        "recovered_at": dt(float(steps.ts[beyond].min())) if beyond.any() else None,
        "lost_breakdown": breakdown,
        "lost_gpu_seconds": sum(breakdown.values()),
    }


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
            lambda: signals.incident_resolved.send(sender=Incident, incident=incident), robust=True
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
