"""The jobs pages: every job with its ledger, and one job in depth: where its GPU-hours
went, its goodput over time, its progress with launches, checkpoints and incidents,
loss and step time, a rank-by-window heatmap, and a what-if panel for checkpointing.

Every series is read reduced (jobs.selectors.job_step_buckets: buckets of steps and
time, cached and brought up to date incrementally), so a job of 1,000,000 steps costs
about what a small one does. The figures are drawn by console.charts.jobs; the
slow-step rule and the checkpoint cadence are jobs.step_stats'.
"""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.core.exceptions import ObjectDoesNotExist
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, render
from django.urls import path
from django.utils import timezone

from console import whatif
from console.charts import CATEGORY_COLOURS, chart_script
from console.charts.jobs import (
    badput_figure,
    badput_sentence,
    goodput_time_figure,
    loss_figure,
    progress_figure,
    step_time_figure,
)
from console.charts.ranks import rank_figure
from console.pages.common import job_heard, viewer_page
from incidents import selectors as incident_selectors
from jobs import selectors
from jobs import services as job_services
from jobs.accounting import CATEGORIES
from jobs.step_stats import SLOW_FACTOR, job_checkpoint_cadence, job_step_times

JOBS_PER_PAGE = 100
LEDGER_STALE_S = 60  # a cached ledger this recent is shown as is (its "as of" says when)
LAUNCHES_CHARTED = 200  # launches shaded on the progress chart, and selectable
TABLE_ROWS = 25  # launches and checkpoints listed
INCIDENTS_CHARTED = 200
INCIDENTS_LISTED = 10
HEATMAP_WINDOWS = 200  # the latest windows of the launch, at most
HEATMAP_CELLS = 20_000  # and fewer windows when it has many ranks
HEATMAP_ROWS = 256  # a row per rank up to this many ranks, then a row per node
CHECKPOINT_BUCKET_STEPS = 8  # checkpoints marked: the latest per 8 step buckets


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
    now = timezone.now()
    rows = []
    for job in jobs:
        figures = job_services.job_goodput(job=job, allow_stale=True)
        rows.append(
            {
                "job": job,
                "heard": job_heard(job, now),
                "figures": figures,
                "breakdown": _breakdown(figures),
            }
        )
    return render(
        request,
        "console/job_list.html",
        {
            "rows": rows,
            "page": page,
            "legend": [(n.replace("_", " "), c) for n, c in CATEGORY_COLOURS.items()],
        },
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
    cadence = job_checkpoint_cadence(checkpoint_groups=checkpoint_groups)
    measured = whatif.measure(
        figures=figures,
        launches=launches["total"],
        failures=failures,
        saves=cadence.saves,
        save_gaps=cadence.save_gaps,
        save_span_s=cadence.save_span_s,
        blocking_sum_s=cadence.blocking_sum_s,
        blocking_n=cadence.blocking_n,
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
            max_rows=HEATMAP_ROWS,
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
        ("steptime", step_time_figure(job_step_times(buckets=buckets), buckets.step_width)),
    ]
    if heatmap is not None:
        charts.append(("ranks", rank_figure(heatmap)))
    scripts = {name: chart_script(fig, f"chart-{name}") for name, fig in charts}
    return render(
        request,
        "console/job_detail.html",
        {
            "job": job,
            "heard": job_heard(job, timezone.now()),
            "figures": figures,
            "breakdown": breakdown,
            "no_badput": no_badput,
            "badput_cost": selectors.job_badput_cost(job=job, gpu_seconds=figures["gpu_seconds"]),
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
