"""Server-rendered pages: the jobs and their ledgers."""

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, render

from console.roles import role_allows, user_role
from jobs import selectors
from jobs.accounting import CATEGORIES

# Okabe-Ito colours: distinguishable with the common colour-vision deficiencies.
CATEGORY_COLOURS = {
    "productive": "#009E73",
    "startup": "#E69F00",
    "checkpoint_restore": "#56B4E9",
    "checkpoint_save": "#0072B2",
    "wasted_progress": "#D55E00",
    "stalled": "#CC79A7",
    "downtime": "#333333",
    "other": "#BBBBBB",
}


def _require_viewer(request):
    if not role_allows(user_role(request.user), "viewer"):
        raise PermissionDenied("You need the viewer role to see this console.")


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
        }
        for name in CATEGORIES
    ]


@login_required
def job_list(request):
    _require_viewer(request)
    jobs = list(selectors.job_list()[:200])
    selectors.attach_summaries(jobs)
    rows = []
    for job in jobs:
        figures = selectors.job_goodput(job=job, allow_stale=True)
        rows.append({"job": job, "figures": figures, "breakdown": _breakdown(figures)})
    return render(
        request,
        "console/job_list.html",
        {"rows": rows, "legend": [(n.replace("_", " "), c) for n, c in CATEGORY_COLOURS.items()]},
    )


@login_required
def job_detail(request, key):
    _require_viewer(request)
    job = get_object_or_404(selectors.job_list(), key=key)
    selectors.attach_summaries([job])
    figures = selectors.job_goodput(job=job)
    return render(
        request,
        "console/job_detail.html",
        {
            "job": job,
            "figures": figures,
            "breakdown": _breakdown(figures),
            "attempts": selectors.job_attempts(job=job),
            "checkpoints": selectors.job_checkpoints(job=job),
        },
    )
