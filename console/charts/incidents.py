"""The incident page's charts: its timeline on a time axis (one row per kind of
entry) and its lost GPU-hours by category."""

from __future__ import annotations

from datetime import UTC, datetime

from console.charts.base import CATEGORY_COLOURS, OKABE_ITO, figure
from incidents.models import Incident, TimelineEntry

# Colours of the timeline's rows, one per entry kind.
KIND_COLOURS = {
    TimelineEntry.Kind.SIGNAL: OKABE_ITO["vermillion"],
    TimelineEntry.Kind.DETECTION: OKABE_ITO["orange"],
    TimelineEntry.Kind.STATE_CHANGE: OKABE_ITO["blue"],
    TimelineEntry.Kind.ACTION: OKABE_ITO["green"],
    TimelineEntry.Kind.APPROVAL: OKABE_ITO["purple"],
    TimelineEntry.Kind.NOTE: OKABE_ITO["sky"],
}
LOST_COLOURS = {**CATEGORY_COLOURS, "slowdown": OKABE_ITO["yellow"]}
HOVER_CHARS = 300


def _plotly_time(at: datetime) -> str:
    """UTC without an offset: plotly.js ignores offsets, so the axis reads UTC."""
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def timeline_figure(entries: list[TimelineEntry]) -> dict:
    """The timeline on a time axis: one row (and trace) per kind of entry."""
    kinds = [k for k in TimelineEntry.Kind.values if any(e.kind == k for e in entries)]
    data = []
    for kind in kinds:
        mine = [e for e in entries if e.kind == kind]
        label = kind.replace("_", " ")
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": label,
                "x": [_plotly_time(e.at) for e in mine],
                "y": [label] * len(mine),
                "text": [f"{e.actor}: {e.message[:HOVER_CHARS]}" for e in mine],
                "hovertemplate": "%{x}<br>%{text}<extra>" + label + "</extra>",
                "marker": {"color": KIND_COLOURS.get(kind, OKABE_ITO["black"]), "size": 11},
            }
        )
    return figure(
        data,
        "Timeline",
        "time (UTC)",
        "entry kind",
        yaxis={"type": "category", "categoryorder": "array", "automargin": True},
        height=max(220, 90 + 45 * len(kinds)),
    )


def lost_figure(incident: Incident) -> dict:
    """The lost GPU-hours by category: one stacked horizontal bar."""
    label = f"#{incident.pk}"
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "name": name.replace("_", " "),
            "x": [gpu_s / 3600.0],
            "y": [label],
            "marker": {"color": LOST_COLOURS.get(name, OKABE_ITO["grey"])},
            "hovertemplate": "%{x:.3f} GPU-h<extra>" + name.replace("_", " ") + "</extra>",
        }
        for name, gpu_s in (incident.lost_breakdown or {}).items()
        if gpu_s
    ]
    return figure(
        data,
        "Lost GPU-hours by category",
        "GPU-hours",
        "incident",
        barmode="stack",
        height=260,
        yaxis={"type": "category"},
        legend={"traceorder": "normal", "y": -0.6},
        margin={"b": 110},
    )
