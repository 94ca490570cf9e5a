"""Storage upkeep as detection allows it: jobs.services.upkeep rolls the streams up,
never past what the detectors of a job have read or may read again (its detector
state), and keeping the rank windows its incidents name as evidence."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings

from common.time import dt
from incidents.detectors.state import EngineState, Rebuild
from incidents.detectors.straggler import STRAGGLER
from incidents.models import DetectorState, Incident
from incidents.settings import detector_settings
from jobs.models import Attempt, TrainingJob, UpkeepRun
from jobs.services.upkeep import Limits, storage_upkeep

NOTHING = Limits(
    beats_upto_id=0,
    beats_held=frozenset(),
    span_gap_s=0.0,
    windows_upto_id=0,
    window_heads={},
    ended=frozenset(),
    evidence=frozenset(),
)


def incidents_storage_upkeep(*, now: datetime | None = None) -> UpkeepRun:
    """One run of storage upkeep over every job (README, "Storage")."""
    return storage_upkeep(limits_of=upkeep_limits, now=now)


def upkeep_limits(job: TrainingJob) -> Limits:
    """How far upkeep may roll the job's streams up: nothing its detectors have not
    read, nor what they hold to read again."""
    row = DetectorState.objects.filter(job=job).first()
    try:
        state = EngineState.from_dict(row.data) if row is not None and row.data else None
    except Rebuild:
        state = None  # the next pass rebuilds it: it reads everything again
    if state is None:
        return NOTHING
    timeout = float(detector_settings(job)["dead_node.timeout_s"])
    window_cutoff = job.last_event_ts - settings.REBOUND_KEEP_RANK_WINDOWS_S
    ended = frozenset(
        Attempt.objects.filter(job=job, ended_at__lt=dt(window_cutoff)).values_list(
            "number", flat=True
        )
    )
    windows_upto = state.cursor["window"]
    heads = {}
    for number, ls in state.launches.items():
        if ls.windows is not None and ls.windows.head is not None:
            heads[number] = ls.windows.head
        # Windows not complete yet are read back from the lowest of their ids.
        if ls.pending_from is not None and number not in ended:
            windows_upto = min(windows_upto, ls.pending_from - 1)
    return Limits(
        beats_upto_id=state.cursor["beat"],
        beats_held=frozenset(o[0] for b in state.beats.values() for o in b.open),
        span_gap_s=min(settings.REBOUND_HEARTBEAT_SPAN_GAP_S, timeout),
        windows_upto_id=windows_upto,
        window_heads=heads,
        ended=ended,
        evidence=_evidence_windows(job),
    )


def _evidence_windows(job: TrainingJob) -> frozenset[tuple[int, int, int]]:
    """(launch, first step, node id) of the windows the job's stragglers name."""
    out = set()
    for incident in Incident.objects.filter(job=job, detector=STRAGGLER).prefetch_related("nodes"):
        node_ids = [n.pk for n in incident.nodes.all()]
        for item in incident.evidence:
            kind, _, key = item.partition(":")
            number, _, first = key.partition(":")
            if kind == "window" and number.isdigit() and first.lstrip("-").isdigit():
                out.update((int(number), int(first), nid) for nid in node_ids)
    return frozenset(out)
