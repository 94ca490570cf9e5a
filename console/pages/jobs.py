"""The jobs pages: every job with its ledger, and one job in depth."""

from django.shortcuts import get_object_or_404, render
from django.urls import path

from console.charts import CATEGORY_COLOURS
from console.pages.common import viewer_page
from jobs import selectors
from jobs.accounting import CATEGORIES


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


@viewer_page
def job_list(request):
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


@viewer_page
def job_detail(request, key):
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


urls = [
    path("jobs/", job_list, name="job-list"),
    path("jobs/<slug:key>/", job_detail, name="job-detail"),
]
