"""The reliability report's charts: failures and lost GPU-hours by cause, and the
goodput week by week."""

from __future__ import annotations

from console.charts.base import OKABE_ITO, figure

# One colour per chart: the bars' labels name the causes (ten causes would need more
# distinguishable colours than Okabe-Ito has).
FAILURES_COLOUR = OKABE_ITO["blue"]
LOST_COLOUR = OKABE_ITO["vermillion"]


def cause_label(cause: str) -> str:
    return cause.replace("_", " ")


def cause_figure(by_cause: dict, key: str, title: str, y_title: str, fmt: str, colour: str) -> dict:
    # Failures: the causes that had one (a straggler's slowdown has none).
    causes = [c for c in by_cause if key != "failures" or by_cause[c][key]]
    return figure(
        [
            {
                "type": "bar",
                "name": y_title,
                "x": [cause_label(c) for c in causes],
                "y": [by_cause[c][key] for c in causes],
                "marker": {"color": colour},
                "hovertemplate": "%{x}: %{y" + fmt + "}<extra></extra>",
            }
        ],
        title,
        "cause",
        y_title,
    )


def goodput_by_week_figure(weeks: list[dict]) -> dict:
    # A week with no GPU time stays on the axis, as a gap.
    return figure(
        [
            {
                "type": "bar",
                "name": "goodput, GPU-weighted (estimated)",
                "x": [w["week"] for w in weeks],
                "y": [
                    None if w["goodput"] is None else round(100 * w["goodput"], 2) for w in weeks
                ],
                "customdata": [[round(w["gpu_hours"], 1), w["jobs"]] for w in weeks],
                "marker": {"color": OKABE_ITO["green"]},
                "hovertemplate": "%{x}: %{y:.1f}% of %{customdata[0]} GPU-h,"
                " %{customdata[1]} jobs<extra></extra>",
            }
        ],
        "Goodput by week",
        "ISO week (UTC)",
        "goodput (%)",
        yaxis={"range": [0, 100], "ticksuffix": "%"},
    )
