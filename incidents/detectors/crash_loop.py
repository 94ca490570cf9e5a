"""The crash-loop detector: launches in a storm (`crash_loop.launches` within
`crash_loop.window_s`), or `crash_loop.no_progress_launches` in a row that never
advance the checkpoint: restarting will not fix it. One finding per loop; a
launch that completes or advances the checkpoint ends the loop."""

from __future__ import annotations

from dataclasses import dataclass

from common.time import dt
from incidents.detectors.base import Finding, Signal
from incidents.models import Incident
from jobs.models import Event, TrainingJob
from jobs.selectors import checkpoints_durable_latest_by_launch

CRASH_LOOP = "crash_loop"  # the detector's name on its incidents


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


def launch_records(job: TrainingJob) -> list[LaunchRecord]:
    """The job's launches in start order: when each started and ended, why, and the
    checkpoints it resumed from and saved."""
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
    saved = checkpoints_durable_latest_by_launch(job)
    for r in records.values():
        r.best_saved = saved.get(r.number)
    return sorted(records.values(), key=lambda r: (r.start, r.number))


def findings(*, job: TrainingJob, cfg: dict, launch_findings: list[Finding]) -> list[Finding]:
    """One finding per loop; its cause is the one most of its launches failed of
    (`launch_findings`: the pass's launch-fault findings)."""
    C, S = Incident.Cause, Incident.Severity
    storm_n, window = int(cfg["crash_loop.launches"]), float(cfg["crash_loop.window_s"])
    stuck_n = int(cfg["crash_loop.no_progress_launches"])
    causes = {f.fields["attempt"]: f.fields["cause"] for f in launch_findings}
    records = launch_records(job)

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

    out = []
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
        out.append(Finding(CRASH_LOOP, f"loop-{first.number}", fields, [], signals_, why))
    return out
