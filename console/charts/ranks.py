"""The job page's rank heatmap: compute time per rank (or per node, its slowest rank)
and window of one launch, drawn from jobs.selectors.job_rank_heatmap and coloured by
each cell's ratio to its window's median rank on a fixed scale."""

from __future__ import annotations

import math

import numpy as np

from console.charts.base import figure

# The heatmap's colour: a cell's compute time over its window's median rank's, on a
# fixed scale, so that the noise of a healthy job (a few percent) stays one neutral
# colour and a node 1.6x slower is loud, whatever the spread of the window.
RATIO_MIN, RATIO_MAX = 0.8, 2.0
RATIO_NEUTRAL = (0.95, 1.05)


def _ratio_stop(ratio: float) -> float:
    return round((ratio - RATIO_MIN) / (RATIO_MAX - RATIO_MIN), 4)


RATIO_COLOURS = [
    [0.0, "#2166ac"],  # faster than the median
    [_ratio_stop(RATIO_NEUTRAL[0]), "#f2f2f2"],
    [_ratio_stop(RATIO_NEUTRAL[1]), "#f2f2f2"],
    [_ratio_stop(1.2), "#fdbf6f"],
    [_ratio_stop(1.6), "#e31a1c"],
    [1.0, "#67000d"],
]


def cell_ratios(compute: list[list], median: list) -> list[list]:
    """Each cell's compute seconds over its window's median rank's, to 3 decimals; None
    where either is unknown or the median is not positive."""
    if not compute:
        return []
    cells = np.array(compute, dtype=np.float64)  # None: NaN
    medians = np.array(median, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.round(np.where(medians > 0, cells / medians, np.nan), 3)
    return [[None if math.isnan(v) else v for v in row] for row in ratio.tolist()]


def rank_figure(heatmap: dict) -> dict:
    """Compute time per row (a rank, or a node's slowest rank) and window of one launch,
    coloured by its ratio to the window's median rank: a straggler is a red row."""
    first_steps, median = heatmap["first_steps"], heatmap["median"]
    by_node = heatmap["by"] == "node"
    z = cell_ratios(heatmap["compute"], median)
    if by_node:
        custom = [
            [[c, r] for c, r in zip(cells, ranks, strict=True)]
            for cells, ranks in zip(heatmap["compute"], heatmap["ranks"], strict=True)
        ]
        hover = (
            "%{y}<br>window from step %{x:,}<br>slowest rank %{customdata[1]}:"
            " %{z:.2f}x the window's median rank, %{customdata[0]:.3f} s<extra></extra>"
        )
    else:
        custom = heatmap["compute"]
        hover = (
            "%{y}<br>window from step %{x:,}<br>%{z:.2f}x the window's median rank,"
            " %{customdata:.3f} s<extra></extra>"
        )
    shown = f"latest {len(first_steps)} windows" if first_steps else "no windows"
    if by_node:
        what = "Slowest rank per node and window"
        extent = f"{heatmap['rank_count']:,} ranks on {heatmap['node_count']:,} nodes, {shown}"
        if heatmap["left_out"]:
            extent += f"; the slowest {len(heatmap['rows']):,} nodes"
    else:
        what, extent = "Compute time per rank and window", shown
    ticks = [RATIO_MIN, 1.0, 1.2, 1.6, RATIO_MAX]
    return figure(
        [
            {
                "type": "heatmap",
                "name": "compute / window median",
                "x": first_steps,
                "y": [r["label"] for r in heatmap["rows"]],
                "z": z,
                "customdata": custom,
                "zmin": RATIO_MIN,
                "zmax": RATIO_MAX,
                "colorscale": RATIO_COLOURS,
                "colorbar": {
                    "title": {"text": "x window's<br>median rank"},
                    "tickvals": ticks,
                    "ticktext": [
                        f"\u2264{RATIO_MIN:g}x",
                        "1x",
                        "1.2x",
                        "1.6x",
                        f"\u2265{RATIO_MAX:g}x",
                    ],
                },
                "hovertemplate": hover,
                "hoverongaps": False,
            }
        ],
        f"{what}, launch {heatmap['attempt']} ({extent})",
        "window's first step",
        "node (slowest rank)" if by_node else "rank \u00b7 node",
        yaxis={"autorange": "reversed", "type": "category"},
        height=max(320, min(1200, 120 + 18 * len(heatmap["rows"]))),
        margin={"l": 200 if by_node else 160},
    )
