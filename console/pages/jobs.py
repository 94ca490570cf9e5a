"""The jobs pages: every job with its ledger, and one job in depth: where its GPU-hours
went, its goodput over time, its progress with launches, checkpoints and incidents,
loss and step time, a rank-by-window heatmap, and a what-if panel for checkpointing.

Every series is read reduced (jobs.selectors.job_step_buckets: buckets of steps and
time, cached and brought up to date incrementally), so a job of 1,000,000 steps costs
about what a small one does; `downsample` is the last guard on each series.
"""

from __future__ import annotations

import math
import warnings
from datetime import datetime, timedelta

import numpy as np
from django import forms
from django.core.exceptions import ObjectDoesNotExist
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, render
from django.urls import path
from django.utils import timezone

from console import whatif
from console.charts import (
    CATEGORY_COLOURS,
    MAX_POINTS,
    OKABE_ITO,
    chart_script,
    figure,
    gpu_amount,
    gpu_hours,
    line,
    significant,
)
from console.pages.common import viewer_page
from incidents import selectors as incident_selectors
from jobs import selectors
from jobs import services as job_services
from jobs.accounting import CATEGORIES
from jobs.selectors import BUCKET_COLUMNS

JOBS_PER_PAGE = 100
LEDGER_STALE_S = 60  # a cached ledger this recent is shown as is (its "as of" says when)
LAUNCHES_CHARTED = 200  # launches shaded on the progress chart, and selectable
TABLE_ROWS = 25  # launches and checkpoints listed
INCIDENTS_CHARTED = 200
INCIDENTS_LISTED = 10
SLOW_FACTOR = 2.0  # a step slower than this x the rolling median is slow
ROLLING_BUCKETS = 21  # the rolling median's window, in step buckets
HEATMAP_WINDOWS = 200  # the latest windows of the launch, at most
HEATMAP_CELLS = 20_000  # and fewer windows when it has many ranks
HOVER_CHARS = 200
CHECKPOINT_BUCKET_STEPS = 8  # checkpoints marked: the latest per 8 step buckets
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


def _breakdown(figures: dict) -> list[dict]:
    elapsed = figures["elapsed_s"] or 0.0
    gpu_total = sum(figures["gpu_seconds"].values()) or 0.0
    return [
        {
            "name": name,
            "label": name.replace("_", " "),
            "colour": CATEGORY_COLOURS[name],
            "seconds": figures["categories"][name],
            "gpu_hours": figures["gpu_seconds"][name] / 3600.0,
            "share": figures["categories"][name] / elapsed if elapsed else 0.0,
            "gpu_share": figures["gpu_seconds"][name] / gpu_total if gpu_total else 0.0,
            "share_pct": 100 * figures["categories"][name] / elapsed if elapsed else 0.0,
            "gpu_share_pct": 100 * figures["gpu_seconds"][name] / gpu_total if gpu_total else 0.0,
        }
        for name in CATEGORIES
    ]


@viewer_page
def job_list(request):
    qs = selectors.job_list()
    page = Paginator(qs, JOBS_PER_PAGE).get_page(request.GET.get("page"))
    jobs = list(page.object_list)
    selectors.attach_summaries(jobs)
    rows = []
    for job in jobs:
        figures = job_services.job_goodput(job=job, allow_stale=True)
        rows.append({"job": job, "figures": figures, "breakdown": _breakdown(figures)})
    return render(
        request,
        "console/job_list.html",
        {
            "rows": rows,
            "page": page,
            "legend": [(n.replace("_", " "), c) for n, c in CATEGORY_COLOURS.items()],
        },
    )


# --- the job page's figures ------------------------------------------------------------


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
    """console.charts.figure, with a smaller title for charts side by side."""
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


def _rolling_median(values: np.ndarray, window: int) -> np.ndarray:
    if not len(values):
        return values
    half = window // 2
    padded = np.concatenate([np.full(half, np.nan), values, np.full(half, np.nan)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a window with no value
        return np.nanmedian(np.lib.stride_tricks.sliding_window_view(padded, window), axis=1)


def step_time_figure(buckets: selectors.StepBuckets) -> dict:
    """Step time against step: the mean per step bucket, and in red the buckets whose
    slowest step took over SLOW_FACTOR x the rolling median of the means."""
    b = buckets
    sb, inverse = np.unique(b.col("sb"), return_inverse=True)
    inverse = inverse.ravel()

    def total(values):
        return np.bincount(inverse, weights=np.nan_to_num(values), minlength=len(sb))

    def extreme(values, how):
        acc = np.full(len(sb), np.inf if how is np.fmin else -np.inf)
        how.at(acc, inverse, values)
        acc[np.isinf(acc)] = np.nan
        return acc

    lo, hi = extreme(b.col("step_lo"), np.fmin), extreme(b.col("step_hi"), np.fmax)
    st_n = total(b.col("st_n"))
    reported = bool(st_n.any())
    with np.errstate(invalid="ignore", divide="ignore"):
        if reported:
            means = np.where(st_n > 0, total(b.col("st_sum")) / st_n, np.nan)
            source = "reported"
        else:  # the time between step reports, within a launch
            several = b.col("n") > 1
            spans = total(np.where(several, b.col("ts_hi") - b.col("ts_lo"), 0.0))
            gaps = total(np.where(several, b.col("n") - 1, 0.0))
            means = np.where(gaps > 0, spans / gaps, np.nan)
            source = "between reports"
    slowest = extreme(b.col("st_max"), np.fmax)
    rolling = _rolling_median(means, ROLLING_BUCKETS)
    with np.errstate(invalid="ignore"):
        slow = np.flatnonzero(slowest > SLOW_FACTOR * rolling) if reported else np.array([], int)
    slow = slow[np.argsort(-(slowest[slow] / rolling[slow]), kind="stable")[:SLOW_MARKED]]
    slow.sort()
    xs = _list((lo + hi) / 2, 1)
    width = b.step_width
    label = "step" if width == 1 else f"{width:,} steps"
    return _figure(
        [
            line(
                xs,
                _list(means, 4),
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
        f"Step time ({source}); red: slowest step > {SLOW_FACTOR:g}x the rolling median",
        "step",
        "step time (s)",
        **HALF,
    )


def rank_figure(heatmap: dict) -> dict:
    """Compute seconds per rank and window of one launch: a straggler is a bright row."""
    ranks, first_steps = heatmap["ranks"], heatmap["first_steps"]
    col = {s: j for j, s in enumerate(first_steps)}
    row = {r: i for i, r in enumerate(ranks)}
    z = [[None] * len(first_steps) for _ in ranks]
    nodes: dict[int, str] = {}
    for rank, first, _, compute, node in heatmap["cells"]:
        if first in col and rank in row:
            z[row[rank]][col[first]] = round(compute, 4) if math.isfinite(compute) else None
            if node:
                nodes.setdefault(rank, node)
    labels = [f"rank {r} · {nodes.get(r, 'node ?')}" for r in ranks]
    shown = f"latest {len(first_steps)} windows" if first_steps else "no windows"
    more = ""
    if heatmap["rank_count"] > len(ranks):
        more = f", first {len(ranks)} of {heatmap['rank_count']} ranks"
    return _figure(
        [
            {
                "type": "heatmap",
                "name": "compute seconds",
                "x": first_steps,
                "y": labels,
                "z": z,
                "colorscale": "Viridis",
                "colorbar": {"title": {"text": "compute (s)"}},
                "hovertemplate": "%{y}<br>window from step %{x:,}<br>compute %{z:.3f} s"
                "<extra></extra>",
                "hoverongaps": False,
            }
        ],
        f"Compute time per rank and window, launch {heatmap['attempt']} ({shown}{more})",
        "window's first step",
        "rank · node",
        yaxis={"autorange": "reversed", "type": "category"},
        height=max(320, min(900, 120 + 18 * len(ranks))),
        margin={"l": 160},
    )


# --- the what-if panel -------------------------------------------------------------


class WhatIfForm(forms.Form):
    """Values typed over the measured ones; blank keeps the measured value."""

    mtbf_h = forms.FloatField(
        required=False, min_value=0.001, label="Mean time between failures (h)"
    )
    restart_min = forms.FloatField(required=False, min_value=0, label="Restart overhead (min)")
    wait_min = forms.FloatField(required=False, min_value=0, label="Wait after a failure (min)")
    checkpoint_s = forms.FloatField(required=False, min_value=0, label="Checkpoint cost (s)")
    interval_min = forms.FloatField(
        required=False, min_value=0.001, label="Checkpoint interval (min)"
    )


_FORM_UNITS = {  # form field -> (model input, seconds per unit)
    "mtbf_h": ("mtbf", 3600.0),
    "restart_min": ("restart", 60.0),
    "wait_min": ("wait", 60.0),
    "checkpoint_s": ("checkpoint", 1.0),
    "interval_min": ("interval", 60.0),
}


def _what_if(
    request, figures: dict, launches: dict, marks: dict, checkpoint_groups: list[dict]
) -> dict:
    failures = marks["failures"]  # as the reliability report counts them
    per_launch: dict[int, list] = {}  # launch -> [saves, first save, last save]
    for g in checkpoint_groups:
        if g["saved"]:
            cur = per_launch.setdefault(g["attempt"], [0, g["first_saved_at"], g["last_saved_at"]])
            cur[0] += g["saved"]
            cur[1], cur[2] = min(cur[1], g["first_saved_at"]), max(cur[2], g["last_saved_at"])
    spread = [v for v in per_launch.values() if v[0] > 1]  # two saves or more
    gaps = sum(n - 1 for n, _, _ in spread)
    span = sum((last - first).total_seconds() for _, first, last in spread)
    saves = sum(v[0] for v in per_launch.values())
    blocking_sum = sum(g["blocking_sum"] or 0.0 for g in checkpoint_groups)
    blocking_n = sum(g["blocking_n"] for g in checkpoint_groups)
    measured = whatif.measure(
        figures=figures,
        launches=launches["total"],
        failures=failures,
        saves=saves,
        save_gaps=gaps,
        save_span_s=span,
        blocking_sum_s=blocking_sum,
        blocking_n=blocking_n,
    )
    form = WhatIfForm(request.GET or None)
    entered: dict[str, float | None] = {}
    if form.is_bound and form.is_valid():
        for field, (name, unit) in _FORM_UNITS.items():
            value = form.cleaned_data.get(field)
            entered[name] = None if value is None else value * unit
    result = whatif.plan(measured=measured, entered=entered)
    if result["young_s"] is not None:
        result["young_min"] = result["young_s"] / 60.0
        result["daly_min"] = result["daly_s"] / 60.0
        result["waste_pct"] = 100.0 * result["waste_floor"]
    for row in result["rows"]:
        row["interval_min"] = row["interval_s"] / 60.0
        row["ettr_pct"] = 100.0 * row["ettr"]
    units = {name: (field, unit) for field, (name, unit) in _FORM_UNITS.items()}
    inputs = []
    for name in whatif.NAMES:
        q = result["inputs"][name]
        field, unit = units[name]
        inputs.append(
            {
                "name": field,
                "label": form.fields[field].label,
                "value": request.GET.get(field, ""),
                "errors": form.errors.get(field, []) if form.is_bound else [],
                "quantity": q,
                "shown": None if q.value is None else q.value / unit,
                "measured": measured[name],
                "measured_shown": None
                if measured[name].value is None
                else measured[name].value / unit,
            }
        )
    return {
        "form": form,
        "inputs": inputs,
        "result": result,
        "failures": failures,
        "failure_definition": incident_selectors.FAILURE_DEFINITION,
    }


# --- the job page ------------------------------------------------------------------


def _snapshot_recent(job) -> bool:
    """Whether the cached ledger may be shown although ingest has stored more since: a
    refresh follows every ingest within seconds (jobs.services), and recomputing a
    1,000,000-step ledger in the request takes over a second. Past LEDGER_STALE_S (no
    worker refreshed it), the page recomputes it."""
    try:
        snapshot = job.ledger
    except ObjectDoesNotExist:
        return False
    return timezone.now() - snapshot.computed_at < timedelta(seconds=LEDGER_STALE_S)


@viewer_page
def job_detail(request, key):
    job = get_object_or_404(selectors.job_list(), key=key)
    selectors.attach_summaries([job])
    figures = job_services.job_goodput(job=job, allow_stale=_snapshot_recent(job))
    breakdown = _breakdown(figures)
    buckets = job_services.step_buckets_ensure(job=job)
    kept = selectors.kept_ranges(selectors.launch_order(buckets))
    launches = selectors.job_launches(job=job, limit=LAUNCHES_CHARTED)
    marks = incident_selectors.job_incident_marks(job=job, limit=INCIDENTS_CHARTED)
    checkpoint_groups = job_services.checkpoint_groups_ensure(
        job=job, step_width=buckets.step_width * CHECKPOINT_BUCKET_STEPS
    )
    checkpoints = selectors.job_recent_checkpoints(job=job, limit=TABLE_ROWS)
    listed = launches["rows"][-TABLE_ROWS:][::-1]
    nodes = selectors.launch_node_names(attempt_ids=[a["id"] for a in listed])
    for a in listed:
        a["nodes"] = nodes[a["id"]]

    numbers = {a["number"]: a for a in launches["rows"]}
    try:
        chosen = int(request.GET.get("attempt", ""))
    except ValueError:
        chosen = None
    if chosen not in numbers:
        chosen = launches["rows"][-1]["number"] if launches["rows"] else None
    heatmap = (
        job_services.rank_heatmap_ensure(
            job=job,
            attempt=chosen,
            world_size=numbers[chosen]["world_size"],
            max_windows=HEATMAP_WINDOWS,
            max_cells=HEATMAP_CELLS,
        )
        if chosen is not None
        else None
    )

    timeline = selectors.job_goodput_timeline(buckets=buckets, figures=figures)
    end_ts = timeline["t_end"] if timeline else job.last_event_ts
    no_badput = badput_sentence(breakdown)
    charts = [
        *([] if no_badput else [("badput", badput_figure(breakdown))]),
        ("goodput", goodput_time_figure(timeline)),
        (
            "progress",
            progress_figure(buckets, launches["rows"], checkpoint_groups, marks["rows"], end_ts),
        ),
        ("loss", loss_figure(buckets, kept)),
        ("steptime", step_time_figure(buckets)),
    ]
    if heatmap is not None:
        charts.append(("ranks", rank_figure(heatmap)))
    scripts = {name: chart_script(fig, f"chart-{name}") for name, fig in charts}
    return render(
        request,
        "console/job_detail.html",
        {
            "job": job,
            "figures": figures,
            "breakdown": breakdown,
            "no_badput": no_badput,
            "charts": scripts,
            "launches": listed,
            "launches_total": launches["total"],
            "launch_numbers": [a["number"] for a in launches["rows"]][::-1],
            "chosen_attempt": chosen,
            "heatmap": heatmap,
            "checkpoints": checkpoints,
            "checkpoints_total": sum(g["n"] for g in checkpoint_groups),
            "incidents": marks["rows"][:INCIDENTS_LISTED],
            "incidents_total": marks["total"],
            "whatif": _what_if(request, figures, launches, marks, checkpoint_groups),
            "step_width": buckets.step_width,
            "bucket_s": buckets.time_width,
            "slow_factor": SLOW_FACTOR,
            "other_params": [
                (k, v) for k, v in request.GET.items() if k in _FORM_UNITS and v != ""
            ],
        },
    )


urls = [
    path("jobs/", job_list, name="job-list"),
    path("jobs/<name:key>/", job_detail, name="job-detail"),
]
