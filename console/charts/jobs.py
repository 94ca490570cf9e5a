"""The job page's charts: where the GPU-hours went, goodput over time, progress with
launches, checkpoints and incidents, loss and step time per step bucket (the
rank-by-window heatmap is console.charts.ranks'). Each builder takes selector output
(jobs.selectors, jobs.step_stats, incidents.selectors) and only draws it.

Every series is already reduced (buckets of steps and time), so a job of 1,000,000
steps costs about what a small one does; `downsample` (in `line`) is the last guard.
"""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np

from console.charts.base import (
    MAX_POINTS,
    OKABE_ITO,
    figure,
    gpu_amount,
    gpu_hours,
    line,
    significant,
)
from jobs import selectors
from jobs.selectors import BUCKET_COLUMNS
from jobs.step_stats import ROLLING_BUCKETS, SLOW_FACTOR, StepTimes

HOVER_CHARS = 200
SLOW_MARKED = 500  # slow buckets marked, the slowest first
NEGLIGIBLE_BADPUT = 0.001  # a smaller share of the GPU time gets a sentence, not a chart
BUCKET = {name: i for i, name in enumerate(BUCKET_COLUMNS)}
# The charts side by side: title on the left, clear of the tool bar; legend below.
HALF = {
    "title_size": 14,
    "margin": {"b": 100},
    "legend": {"y": -0.35},
    "height": 360,
}


def _ms(value) -> int | None:
    """Plotly's date axes take milliseconds since the epoch (shown as UTC)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        value = value.timestamp()
    return round(float(value) * 1000.0)


def _ms_list(values: np.ndarray) -> list[int]:
    return np.round(np.asarray(values, dtype=float) * 1000.0).astype(np.int64).tolist()


def _list(values, digits: int) -> list:
    """Numbers for the browser: rounded; NaN and infinities as None (null)."""
    rounded = np.round(np.asarray(values, dtype=float), digits).tolist()
    return [v if math.isfinite(v) else None for v in rounded]


def _figure(data, title, x_title, y_title, *, title_size: int | None = None, **extra) -> dict:
    """console.charts.base.figure, with a smaller title for charts side by side."""
    fig = figure(data, title, x_title, y_title, **extra)
    if title_size:
        fig["layout"]["title"]["font"] = {"size": title_size}
    return fig


def badput_sentence(breakdown: list[dict]) -> str | None:
    """In words, when the badput is none or negligible (its chart would show nothing:
    an empty axis of its own); None when a chart shows it."""
    total = sum(c["gpu_hours"] for c in breakdown)
    badput = sum(c["gpu_hours"] for c in breakdown if c["name"] != "productive")
    if total <= 0:
        return "No GPU time yet."
    if badput <= 0:
        return f"No badput: all {gpu_amount(total)} were productive."
    share = badput / total
    if share >= NEGLIGIBLE_BADPUT:
        return None
    worst = max((c for c in breakdown if c["name"] != "productive"), key=lambda c: c["gpu_hours"])
    return (
        f"Next to no badput: {gpu_amount(badput)} ({significant(100 * share, 1)}%) of"
        f" {gpu_amount(total)}, most of it {worst['label']}; the rest was productive."
    )


def badput_figure(breakdown: list[dict]) -> dict:
    """GPU-hours by ledger category, stacked: every GPU-hour on top, and below the
    badput alone on its own scale (next to 95% productive, it would not show)."""
    total = sum(c["gpu_hours"] for c in breakdown)
    badput = sum(c["gpu_hours"] for c in breakdown if c["name"] != "productive")
    data = []
    for c in breakdown:
        share = c["gpu_hours"] / total if total else 0.0
        common = {
            "type": "bar",
            "orientation": "h",
            "name": c["label"],
            "legendgroup": c["name"],
            "marker": {"color": c["colour"]},
            "x": [round(c["gpu_hours"], 4)],
            "hovertemplate": f"{c['label']}: %{{x:,.3f}} GPU-hours ({share:.2%} of all)"
            "<extra></extra>",
        }
        data.append({**common, "y": ["all"]})
        if c["name"] != "productive":
            below = {"y": ["badput only"], "xaxis": "x2", "yaxis": "y2", "showlegend": False}
            data.append({**common, **below})
    return _figure(
        data,
        f"Where the GPU-hours went: {gpu_hours(total)} GPU-hours,"
        f" {gpu_hours(badput)} of them badput",
        "GPU-hours",
        "ledger",
        barmode="stack",
        height=300,
        yaxis={"domain": [0.68, 1.0]},
        xaxis2={"anchor": "y2", "title": {"text": "GPU-hours of badput alone"}},
        yaxis2={"anchor": "x2", "domain": [0.0, 0.3]},
        margin={"b": 90, "l": 100},
        legend={"y": -0.45},
    )


def goodput_time_figure(timeline: dict | None) -> dict:
    if timeline is None:
        xs, cumulative, sliding, window_h = [], [], [], 1.0
    else:
        xs = _ms_list(timeline["ts"])
        cumulative = _list(100 * timeline["cumulative"], 2)
        sliding = _list(100 * timeline["sliding"], 2)
        window_h = timeline["window_s"] / 3600.0
    window = f"{window_h:g} h" if window_h >= 1 else f"{window_h * 60:g} min"
    hover = "%{x}<br>%{y:.2f}%<extra></extra>"
    return _figure(
        [
            line(xs, cumulative, "cumulative", OKABE_ITO["blue"], hovertemplate=hover),
            line(
                xs,
                sliding,
                f"sliding {window}",
                OKABE_ITO["orange"],
                dash="dot",
                hovertemplate=hover,
            ),
        ],
        f"Goodput over time (share of elapsed time productive): cumulative and over {window}",
        "time (UTC)",
        "goodput (%)",
        xaxis={"type": "date"},
        yaxis={"range": [0, 101]},
    )


def progress_figure(
    buckets: selectors.StepBuckets,
    launches: list[dict],
    checkpoint_groups: list[dict],
    incidents: list[dict],
    end_ts: float | None,
) -> dict:
    """Step against time: each launch shaded, checkpoints and incidents marked; a
    rollback shows as the next launch starting lower."""
    xs: list = []
    ys: list = []
    by_launch: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # its stretch of the line
    if len(buckets):
        keys, per = buckets.grouped("attempt", "tb")
        ts_lo, ts_hi = per[:, BUCKET["ts_lo"]], per[:, BUCKET["ts_hi"]]
        lo, hi = per[:, BUCKET["step_lo"]], per[:, BUCKET["step_hi"]]
        for attempt, _, _ in selectors.launch_order(buckets):
            mine = keys[:, 0] == attempt  # its time buckets, in order
            first_ms = _ms(ts_lo[mine][0])
            if xs:  # a gap: the line does not run through the time between launches
                xs.append((xs[-1] + first_ms) // 2)
                ys.append(None)
            launch_x = [first_ms, *_ms_list(ts_hi[mine])]
            launch_y = [int(lo[mine][0]), *hi[mine].astype(np.int64).tolist()]
            xs.extend(launch_x)
            ys.extend(launch_y)
            by_launch[int(attempt)] = (np.array(launch_x, float), np.array(launch_y, float))
    data = [
        line(
            xs,
            ys,
            "step reached",
            OKABE_ITO["black"],
            hovertemplate="%{x}<br>step %{y:,}<extra></extra>",
        )
    ]
    known_x = np.array([x for x, y in zip(xs, ys, strict=True) if y is not None], dtype=float)
    known_y = np.array([y for y in ys if y is not None], dtype=float)
    for durable, name, colour, symbol in (
        (True, "checkpoint (durable)", OKABE_ITO["blue"], "diamond"),
        (False, "checkpoint (not durable)", OKABE_ITO["orange"], "diamond-open"),
    ):
        groups = sorted(
            (g for g in checkpoint_groups if g["durable"] == durable and g["at"]),
            key=lambda g: g["at"],
        )
        if len(groups) > MAX_POINTS:  # a guard: the groups are bounded by the step buckets
            groups = groups[:: -(-len(groups) // MAX_POINTS)]
        placed = [_on_the_line(g, by_launch) for g in groups]
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": name,
                "x": [x for x, _ in placed],
                "y": [y for _, y in placed],
                "marker": {"color": colour, "symbol": symbol, "size": 6, "opacity": 0.7},
                "text": [_checkpoint_hover(g) for g in groups],
                "hovertemplate": "%{x}<br>%{text}<extra></extra>",
            }
        )
    shown = sorted(incidents, key=lambda i: i["fault_at"])
    fault_ms = [_ms(i["fault_at"]) for i in shown]
    on_line = np.interp(fault_ms, known_x, known_y) if len(known_x) and shown else []
    data.append(
        {
            "type": "scatter",
            "mode": "markers",
            "name": "incident (at its fault time)",
            "x": fault_ms,
            "y": _list(on_line, 0),
            "marker": {"color": OKABE_ITO["vermillion"], "symbol": "x", "size": 10},
            "text": [_incident_hover(i) for i in shown],
            "hovertemplate": "%{x}<br>%{text}<extra></extra>",
        }
    )
    shapes = []
    for k, launch in enumerate(launches):
        if launch["started_at"] is None:
            continue
        start = _ms(launch["started_at"])
        stop = _ms(launch["ended_at"]) or _ms(end_ts) or start
        shapes.append(
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": start,
                "x1": max(stop, start),
                "y0": 0,
                "y1": 1,
                "fillcolor": OKABE_ITO["sky"] if k % 2 else OKABE_ITO["grey"],
                "opacity": 0.18,
                "line": {"width": 0},
                "layer": "below",
                "name": "launch (shaded)",
                "legendgroup": "launch",
                "showlegend": not shapes,
                "label": {
                    "text": f"launch {launch['number']}",
                    "textposition": "top left",
                    "font": {"size": 10},
                },
            }
        )
    for x in fault_ms:
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": x,
                "x1": x,
                "y0": 0,
                "y1": 1,
                "line": {"color": OKABE_ITO["vermillion"], "width": 1, "dash": "dot"},
                "layer": "below",
            }
        )
    return _figure(
        data,
        "Progress: step against time; launches shaded, checkpoints and incidents marked",
        "time (UTC)",
        "step",
        xaxis={"type": "date"},
        shapes=shapes,
        height=380,
    )


def _on_the_line(g: dict, by_launch: dict[int, tuple[np.ndarray, np.ndarray]]) -> tuple:
    """Where a checkpoint sits on its launch's stretch of the progress line: at the time
    the line reaches its step (its launch's steps only rise). A step outside the
    stretch (saved before the launch's first step was reported) sits at its save time,
    at the height of the line then."""
    x, y = _ms(g["at"]), g["step"]
    stretch = by_launch.get(g["attempt"])
    if stretch is None:
        return x, y
    times, steps = stretch
    if steps[0] <= y <= steps[-1]:
        return round(float(np.interp(y, steps, times))), y
    return x, round(float(np.interp(x, times, steps)), 2)


def _checkpoint_hover(g: dict) -> str:
    durable = "durable" if g["durable"] else "not durable"
    text = f"checkpoint of step {g['step']:,} ({durable}), launch {g['attempt']}"
    if g["at"]:
        text += f"<br>saved {g['at']:%Y-%m-%d %H:%M:%S} UTC"
    if g["n"] > 1:
        text += f"<br>latest of {g['n']} in steps {g['first_step']:,} to {g['step']:,}"
    return text


def _incident_hover(i: dict) -> str:
    summary = i["summary"]
    if len(summary) > HOVER_CHARS:
        summary = summary[: HOVER_CHARS - 1] + "…"
    return f"incident #{i['id']} · {i['cause'].replace('_', ' ')} · {i['state']}<br>{summary}"


def _per_step_bucket(rows: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """group_rows by (class, step bucket), step buckets merged two by two until each
    class has at most MAX_POINTS of them."""
    keys, per = selectors.group_rows(rows, keys)
    while len(keys) and np.unique(keys[:, 0], return_counts=True)[1].max() > MAX_POINTS:
        keys = np.column_stack([keys[:, 0], np.floor(keys[:, 1] / 2)])
        per[:, :3] = 0
        keys, per = selectors.group_rows(per, keys)
    return keys, per


def loss_figure(buckets: selectors.StepBuckets, kept: dict[int, list[tuple[int, int]]]) -> dict:
    """Loss against step per step bucket: mean and min-max of the kept executions, and
    apart those a later launch ran again (where a rolled-back spike stays visible)."""
    rows = buckets.rows[buckets.col("loss_n") > 0]
    is_kept = (
        selectors.kept_shares(
            kept, rows[:, BUCKET["attempt"]], rows[:, BUCKET["step_lo"]], rows[:, BUCKET["step_hi"]]
        )
        >= 0.5
    )
    keys, per = _per_step_bucket(rows, np.column_stack([is_kept, rows[:, BUCKET["sb"]]]))
    width = buckets.step_width
    label = "step" if width == 1 else f"{width:,} steps"

    def cols(mask):
        p = per[mask]
        x = _list((p[:, BUCKET["step_lo"]] + p[:, BUCKET["step_hi"]]) / 2, 1)
        mean = p[:, BUCKET["loss_sum"]] / p[:, BUCKET["loss_n"]]
        return x, _list(p[:, BUCKET["loss_min"]], 5), _list(p[:, BUCKET["loss_max"]], 5), mean

    xs, lo, hi, mean = cols(keys[:, 0] == 1)
    band = {"width": 0.5, "color": "rgba(0,114,178,0.35)"}
    data = [
        line(xs, hi, "kept: max", OKABE_ITO["blue"], line=band, showlegend=False, hoverinfo="skip"),
        line(
            xs,
            lo,
            f"kept: min-max per {label}",
            OKABE_ITO["blue"],
            line=band,
            fill="tonexty",
            fillcolor="rgba(0,114,178,0.2)",
            hoverinfo="skip",
        ),
        line(
            xs,
            _list(mean, 5),
            "kept: mean",
            OKABE_ITO["blue"],
            hovertemplate="step %{x:,.0f}<br>mean %{y:.4f}<extra></extra>",
        ),
    ]
    tx, t_lo, t_hi, t_mean = cols(keys[:, 0] == 0)
    data.append(
        {
            "type": "scatter",
            "mode": "markers",
            "name": "run again later (thrown away): mean, min-max",
            "x": tx,
            "y": _list(t_mean, 5),
            "marker": {"color": OKABE_ITO["vermillion"], "size": 5},
            "error_y": {
                "type": "data",
                "symmetric": False,
                "array": _list(np.array(t_hi, dtype=float) - t_mean, 5),
                "arrayminus": _list(t_mean - np.array(t_lo, dtype=float), 5),
                "color": OKABE_ITO["vermillion"],
                "thickness": 1,
                "width": 0,
            },
            "customdata": [list(pair) for pair in zip(t_lo, t_hi, strict=True)],
            "hovertemplate": "step %{x:,.0f} (thrown away)<br>mean %{y:.4f}"
            "<br>min %{customdata[0]:.4f} · max %{customdata[1]:.4f}<extra></extra>",
        }
    )
    return _figure(data, f"Loss against step (per {label})", "step", "loss", **HALF)


def step_time_figure(times: StepTimes, step_width: int) -> dict:
    """Step time against step: the mean per step bucket, and in red the slow buckets
    (jobs.step_stats: slowest step over SLOW_FACTOR x the rolling median of the means)."""
    lo, hi, slowest, rolling = times.step_lo, times.step_hi, times.slowest, times.rolling
    slow = np.sort(times.slow[:SLOW_MARKED])
    xs = _list((lo + hi) / 2, 1)
    label = "step" if step_width == 1 else f"{step_width:,} steps"
    return _figure(
        [
            line(
                xs,
                _list(times.means, 4),
                f"mean per {label}",
                OKABE_ITO["blue"],
                hovertemplate="step %{x:,.0f}<br>mean %{y:.3f} s<extra></extra>",
            ),
            line(
                xs,
                _list(rolling, 4),
                f"rolling median ({ROLLING_BUCKETS} buckets)",
                OKABE_ITO["grey"],
                hoverinfo="skip",
            ),
            {
                "type": "scatter",
                "mode": "markers",
                "name": f"slow: slowest step > {SLOW_FACTOR:g}x rolling median",
                "x": [xs[i] for i in slow],
                "y": _list(slowest[slow], 4),
                "marker": {"color": OKABE_ITO["vermillion"], "size": 8},
                "text": [
                    f"slowest step of steps {int(lo[i]):,} to {int(hi[i]):,}: "
                    f"{slowest[i]:.3f} s, rolling median {rolling[i]:.3f} s"
                    for i in slow
                ],
                "hovertemplate": "%{text}<extra></extra>",
            },
        ],
        f"Step time ({times.source}); red: slowest step > {SLOW_FACTOR:g}x the rolling median",
        "step",
        "step time (s)",
        **HALF,
    )
