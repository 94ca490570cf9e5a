"""What every chart shares: the colours, the layout every figure starts from, line
traces downsampled so a 1,000,000-step series costs what a small one does, the number
formats the pages write, and the script element static/js/console.js draws from."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from django.core.serializers.json import DjangoJSONEncoder
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

MAX_POINTS = 2000  # per series, sent to the browser

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
OKABE_ITO = {
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
    "black": "#333333",
    "grey": "#BBBBBB",
}
CATEGORY_COLOURS = {
    "productive": OKABE_ITO["green"],
    "startup": OKABE_ITO["orange"],
    "checkpoint_restore": OKABE_ITO["sky"],
    "checkpoint_save": OKABE_ITO["blue"],
    "wasted_progress": OKABE_ITO["vermillion"],
    "stalled": OKABE_ITO["purple"],
    "downtime": OKABE_ITO["black"],
    "other": OKABE_ITO["grey"],
}
# Node states on the overview grid and the nodes pages.
NODE_STATE_COLOURS = {
    "active": OKABE_ITO["green"],
    "suspect": OKABE_ITO["yellow"],
    "cordoned": OKABE_ITO["vermillion"],
    "draining": OKABE_ITO["orange"],
    "in_repair": OKABE_ITO["purple"],
    "spare": OKABE_ITO["sky"],
    "retired": OKABE_ITO["grey"],
}


def downsample(xs: Sequence, ys: Sequence, max_points: int = MAX_POINTS) -> tuple[list, list]:
    """At most `max_points` points of the series (x ascending), keeping its shape:
    the series is cut into buckets of equal count, and each bucket keeps its first,
    minimum, maximum and last point in x order. Spikes, dips and steps back (a
    rollback) survive; the first and last points are always kept."""
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"x has {n} values and y {len(ys)}")
    if n <= max_points:
        return list(xs), list(ys)
    if max_points < 4:
        raise ValueError("max_points must be at least 4")
    buckets = max_points // 4
    size = math.ceil(n / buckets)
    keep: list[int] = []
    for start in range(0, n, size):
        end = min(start + size, n)
        idx = {start, end - 1}
        lo = hi = start
        for i in range(start, end):
            y = ys[i]
            if y is None:
                continue
            if ys[lo] is None or y < ys[lo]:
                lo = i
            if ys[hi] is None or y > ys[hi]:
                hi = i
        idx.update((lo, hi))
        keep.extend(sorted(idx))
    return [xs[i] for i in keep], [ys[i] for i in keep]


def significant(value: float, digits: int = 3) -> str:
    """A number for people: `digits` significant digits, thousands grouped, no trailing
    zeros and never an exponent (0.541, 0.0000194, 12.3, 1,234). Every page writes a
    figure it shows twice (a sentence and a table) with this."""
    if not value or not math.isfinite(value):
        return "0" if not value else str(value)
    magnitude = math.floor(math.log10(abs(value)))
    text = f"{value:,.{max(0, digits - 1 - magnitude)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def gpu_hours(value: float) -> str:
    """GPU-hours for a title or a figure on a page: three significant digits, thousands
    grouped (0.0412, 1.63, 12,270), so a small loss does not read as 0.0."""
    return f"{value:,.0f}" if value >= 100 else significant(value)


def gpu_amount(hours: float) -> str:
    """GPU time for a sentence, in the unit that reads best: GPU-hours down to 0.01,
    GPU-seconds below (0.07 GPU-seconds, not 1.94e-05 GPU-hours)."""
    if hours >= 0.01 or hours == 0:
        return f"{gpu_hours(hours)} GPU-hours"
    return f"{significant(hours * 3600.0, 2)} GPU-seconds"


def byte_size(n: float) -> str:
    """A size in decimal units that fit, three significant digits: 48.2 MB, 1.53 TB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{significant(n / scale)} {unit}"
    return f"{int(n)} B"


def layout(title: str, x_title: str, y_title: str, **extra) -> dict:
    """Every chart has a title, axis titles with units, and a legend."""
    base = {
        "title": {"text": title, "x": 0.01, "xanchor": "left"},  # clear of the tool bar
        # automargin: room for the axis titles, whatever the width of the tick labels.
        "xaxis": {"title": {"text": x_title}, "automargin": True},
        "yaxis": {"title": {"text": y_title}, "automargin": True},
        "showlegend": True,
        "legend": {"orientation": "h", "y": -0.25},
        "margin": {"l": 60, "r": 20, "t": 40, "b": 60},
        "height": 320,
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


def figure(data: list[dict], title: str, x_title: str, y_title: str, **extra) -> dict:
    return {"data": data, "layout": layout(title, x_title, y_title, **extra)}


def line(
    xs, ys, name: str, colour: str, *, max_points: int = MAX_POINTS, dash: str = "solid", **extra
) -> dict:
    """A line trace, downsampled. `dash` (solid, dot, dash) tells lines apart beyond colour."""
    xs, ys = downsample(xs, ys, max_points)
    return {
        "type": "scattergl" if len(xs) > 1000 else "scatter",
        "mode": "lines",
        "name": name,
        "x": xs,
        "y": ys,
        "line": {"color": colour, "width": 1.5 if dash == "solid" else 2.5, "dash": dash},
        **extra,
    }


# What json_script escapes, so that no string in a figure can close the script element.
_JSON_ESCAPES = {ord("<"): "\\u003C", ord(">"): "\\u003E", ord("&"): "\\u0026"}


def chart_script(fig: dict, div_id: str) -> SafeString:
    """The figure as static/js/console.js draws it: a JSON script naming its div
    (json_script cannot add the data-chart attribute). NaN is refused: the browser's
    JSON.parse would refuse it too."""
    data = json.dumps(fig, cls=DjangoJSONEncoder, allow_nan=False, separators=(",", ":"))
    return format_html(
        '<script type="application/json" id="{}-data" data-chart="{}">{}</script>',
        div_id,
        div_id,
        mark_safe(data.translate(_JSON_ESCAPES)),  # escaped above, as json_script does
    )
