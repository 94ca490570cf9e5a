"""The console's charts: Plotly figures as plain dicts, built on the server from
selector output, one module per page (`jobs`, `incidents`, `reliability`) on top of
the shared pieces in `base`.

Figures are dicts (not plotly.graph_objects, whose validation costs more than the
page's whole budget); templates embed them with `chart_script` and
static/js/console.js draws every element carrying `data-chart`. The builders only
draw: what a series means (which step is slow, which run was kept) is decided by the
apps' selectors.
"""

from console.charts.base import (
    CATEGORY_COLOURS,
    MAX_POINTS,
    NODE_STATE_COLOURS,
    OKABE_ITO,
    byte_size,
    chart_script,
    downsample,
    figure,
    gpu_amount,
    gpu_hours,
    layout,
    line,
    significant,
)

__all__ = [
    "CATEGORY_COLOURS",
    "MAX_POINTS",
    "NODE_STATE_COLOURS",
    "OKABE_ITO",
    "byte_size",
    "chart_script",
    "downsample",
    "figure",
    "gpu_amount",
    "gpu_hours",
    "layout",
    "line",
    "significant",
]
