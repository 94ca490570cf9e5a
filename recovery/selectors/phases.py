"""Where an incident's time to recover went, phase by phase, so a team sees whether
people or machines are the slow part: detecting the fault, waiting for a person to
approve, queued, acting (the cluster driver), the gap until the next launch started
(the scheduler, a launcher's own restart), restarting it (startup and checkpoint
restore) and catching up to the step the fault lost.

Two clocks: detection, the relaunch, the restart and the catch-up are on the job's
clock (the incident's times); the approval, queue and driver phases are on the
console's (the actions' audit trail). Their durations are added; the gap before the
relaunch is what the actions do not explain, never less than nothing. A moment two
actions share counts once, for the first phase of PAINT_ORDER it is in: while one
action runs and another waits for a person, people are the ones holding it up.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.utils import timezone

from incidents.models import Incident
from recovery.models import Action, ActionAudit

PHASES = (
    # (name, label, who holds it up)
    ("detecting", "detecting the fault", "machines"),
    ("waiting_for_approval", "waiting for approval", "people"),
    ("queued", "queued", "machines"),
    ("acting", "acting (driver)", "machines"),
    ("relaunching", "until the next launch started", "machines"),
    ("restarting", "restarting (startup and restore)", "machines"),
    ("catching_up", "catching up to the step lost", "machines"),
)
LABELS = {name: label for name, label, _ in PHASES}
WHO = {name: who for name, _, who in PHASES}
# An action's state -> the phase its time is spent in (terminal states: none).
STATE_PHASE = {
    Action.State.AWAITING_APPROVAL: "waiting_for_approval",
    Action.State.PROPOSED: "queued",
    Action.State.APPROVED: "queued",
    Action.State.QUEUED: "queued",
    Action.State.RUNNING: "acting",
}
PAINT_ORDER = ("waiting_for_approval", "acting", "queued")


def _seconds(a: datetime | None, b: datetime | None) -> float | None:
    if a is None or b is None:
        return None
    return max(0.0, (b - a).total_seconds())


def _action_spans(incident_ids, now: datetime) -> dict[int, dict[str, float]]:
    """Per incident: seconds its actions spent in each action phase (one query)."""
    entries = defaultdict(list)
    for row in (
        ActionAudit.objects.filter(action__incident_id__in=incident_ids)
        .order_by("action_id", "at", "id")
        .values_list("action__incident_id", "action_id", "at", "to_state")
    ):
        entries[row[0]].append(row[1:])
    out = {}
    for incident_id, rows in entries.items():
        spans = defaultdict(list)  # phase -> [(start, end)]
        for k, (action_id, at, state) in enumerate(rows):
            phase = STATE_PHASE.get(state)
            if phase is None:
                continue
            nxt = rows[k + 1] if k + 1 < len(rows) and rows[k + 1][0] == action_id else None
            spans[phase].append((at, nxt[1] if nxt else now))
        out[incident_id] = _paint(spans)
    return out


def _paint(spans: dict[str, list[tuple[datetime, datetime]]]) -> dict[str, float]:
    """Seconds per phase, each moment counted once, for the first phase of PAINT_ORDER
    that covers it."""
    taken: list[tuple[datetime, datetime]] = []
    seconds = {}
    for phase in PAINT_ORDER:
        total = 0.0
        for a, b in _merge(spans.get(phase, [])):
            total += (b - a).total_seconds() - _covered(a, b, taken)
        seconds[phase] = total
        taken = _merge(taken + spans.get(phase, []))
    return seconds


def _merge(intervals):
    out = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _covered(a, b, merged) -> float:
    return sum(max(0.0, (min(b, y) - max(a, x)).total_seconds()) for x, y in merged)


def incidents_phases(incidents: list[Incident], *, now=None) -> dict[int, dict]:
    """Each incident's phases (see the module's docstring), a fixed number of queries
    whatever their number. A phase not reached yet is None."""
    now = now or timezone.now()
    acting = _action_spans([i.pk for i in incidents], now)
    return {i.pk: _phases(i, acting.get(i.pk, {})) for i in incidents}


def incident_phases(incident: Incident, *, now=None) -> dict:
    return incidents_phases([incident], now=now)[incident.pk]


def _phases(incident: Incident, acting: dict[str, float]) -> dict:
    seconds = {
        "detecting": _seconds(incident.fault_at, incident.detected_at),
        **{p: acting.get(p, 0.0) for p in PAINT_ORDER},
        "relaunching": None,
        "restarting": _seconds(incident.relaunched_at, incident.restored_at),
        "catching_up": _seconds(incident.restored_at, incident.recovered_at),
    }
    if incident.relaunched_at is not None:
        gap = _seconds(incident.detected_at, incident.relaunched_at)
        seconds["relaunching"] = max(0.0, gap - sum(acting.get(p, 0.0) for p in PAINT_ORDER))
    who = {"people": 0.0, "machines": 0.0}
    for name, value in seconds.items():
        who[WHO[name]] += value or 0.0
    return {
        "time_to_recover_s": incident.time_to_recover_s,
        "phases": [
            {"phase": name, "label": label, "who": WHO[name], "seconds": seconds[name]}
            for name, label, _ in PHASES
        ],
        "people_s": who["people"],
        "machines_s": who["machines"],
    }


def phases_summary(incidents: list[Incident], *, now=None) -> dict:
    """Mean seconds per phase over the incidents that reached it, and the share of the
    phases' time people held (the split of MTTR between waiting for a person and
    acting)."""
    per = incidents_phases(incidents, now=now).values()
    means = []
    for name, label, who in PHASES:
        values = [p["seconds"] for x in per for p in x["phases"] if p["phase"] == name]
        values = [v for v in values if v is not None]
        means.append(
            {
                "phase": name,
                "label": label,
                "who": who,
                "incidents": len(values),
                "mean_s": sum(values) / len(values) if values else None,
            }
        )
    people = sum(x["people_s"] for x in per)
    total = people + sum(x["machines_s"] for x in per)
    return {
        "incidents": len(per),
        "phases": means,
        "people_share": people / total if total else None,
    }
