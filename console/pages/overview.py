"""The overview: every node of every cluster as a grid coloured by state, the running
jobs with their goodput and when each was last heard from (silent ones marked), open
incidents, actions waiting for approval and the GPU-hours lost lately.

Built for 2,000 nodes and 100 running jobs in a fixed number of queries: the nodes
in one, the jobs' cumulative ledgers from their cached snapshots, and the last hour
from `jobs.selectors.jobs_recent_goodput` (two queries, no ledger recomputation).
"""

from __future__ import annotations

import re
from collections import Counter
from html import escape
from urllib.parse import quote

from django.core.cache import cache
from django.shortcuts import render
from django.urls import path, reverse
from django.utils import timezone
from django.utils.safestring import mark_safe

from console.charts import NODE_STATE_COLOURS
from console.pages.common import job_heard, span, viewer_page
from incidents.costs import lost_recent
from incidents.models import Incident
from incidents.selectors import incident_list
from jobs import selectors as jobs
from jobs.accounting import job_ledger
from jobs.models import Node, TrainingJob
from recovery.models import Action
from recovery.selectors import action_list

JOBS_MAX = 200
INCIDENTS_MAX = 15
APPROVALS_MAX = 5
RECENT_WINDOW_S = 3600.0
# A job whose current launch does not cover the last hour (it restarted, or began,
# inside it) gets that hour's exact figure from its ledger over the window: for at most
# EXACT_MAX jobs a page, of at most EXACT_STEPS_MAX steps (a 1,000,000-step ledger
# takes a second), each cached per job revision. Past that, the lower bound says so.
EXACT_MAX = 10
EXACT_STEPS_MAX = 200_000
EXACT_CACHE_S = 600

# The grid's cue besides colour: a letter per state (active, the usual state, is plain).
STATE_LETTERS = {
    "active": "",
    "suspect": "S",
    "cordoned": "C",
    "draining": "D",
    "in_repair": "R",
    "spare": "+",
    "retired": "\u2013",  # an en dash
}
STATE_LABELS = {s.value: s.value.replace("_", " ") for s in Node.State}
_PLAIN = re.compile(r"[A-Za-z0-9._~-]+\Z").match


def segment(text: str) -> str:
    """`text` as one URL path segment (percent-encoding leaves nothing HTML escapes)."""
    return text if _PLAIN(text) else quote(text, safe="")


def node_states() -> list[dict]:
    """The legend: each state with its colour and letter, in lifecycle order."""
    return [
        {
            "state": s.value,
            "label": s.label.lower().replace("_", " "),
            "colour": NODE_STATE_COLOURS[s.value],
            "letter": STATE_LETTERS[s.value],
        }
        for s in Node.State
    ]


def node_grid() -> list[dict]:
    """Per cluster: its nodes' grid cells (retired ones left out, those an open incident
    names ringed, the incident in the cell's title) and its counts per state; two
    queries.

    The cells are built here rather than in a template loop: 2,000 of them cost the
    template engine about 200 ms, a join of escaped strings a few."""
    prefix = reverse("console:node-list")
    clusters: dict[str, dict] = {}
    incidents = open_incidents_by_node()
    rows = Node.objects.order_by("cluster__name", "name").values_list(
        "pk", "name", "state", "cluster__name"
    )
    for pk, name, state, cluster in rows:
        c = clusters.get(cluster)
        if c is None:
            c = clusters[cluster] = {"name": cluster, "cells": [], "counts": Counter()}
            c["href"] = f"{prefix}{segment(cluster)}/"
        c["counts"][state] += 1
        if state != Node.State.RETIRED:
            n, st = escape(name), escape(state)
            label = STATE_LABELS.get(state, st)
            # the live poll rewrites the title from data-name, -state and -incident
            named = escape(incidents.get(pk, ""))
            marked = f' data-incident="{named}"' if named else ""
            about = f"; open incident {named}" if named else ""
            c["cells"].append(
                f'<a class="ns ncell{" incident" if named else ""}"'
                f' href="{c["href"]}{segment(name)}/" data-live-node="{pk}" data-name="{n}"'
                f' data-state="{st}"{marked} title="{n}: {label}{about}"></a>'
            )
    order = [s.value for s in Node.State]
    for c in clusters.values():
        c["total"] = sum(c["counts"].values())
        c["count_rows"] = [(s, c["counts"][s]) for s in order if c["counts"][s]]
        c["cells"] = mark_safe("".join(c["cells"]))  # each value escaped above
    return list(clusters.values())


def open_incidents_by_node() -> dict[int, str]:
    """Per node id that an open incident names: the newest such incident in words
    ("#12 straggler (slow_rank)", "and 2 more" when there are others); one query."""
    rows = (
        Incident.nodes.through.objects.filter(incident__state__in=Incident.OPEN_STATES)
        .order_by("node_id", "-incident_id")
        .values_list("node_id", "incident_id", "incident__cause", "incident__fault_type")
    )
    newest: dict[int, str] = {}
    others: Counter = Counter()
    for node_id, incident_id, cause, fault_type in rows:
        if node_id in newest:
            others[node_id] += 1
            continue
        newest[node_id] = f"#{incident_id} {cause}" + (f" ({fault_type})" if fault_type else "")
    for node_id, n in others.items():
        newest[node_id] += f" and {n} more"
    return newest


def _exact_recent(job: TrainingJob, start: float, end: float) -> float | None:
    """The ledger's goodput over [start, end], cached per job revision."""
    key = f"overview-last-hour-{job.pk}-{job.revision}-{start}-{end}"
    value = cache.get(key)
    if value is None:
        value = {"goodput": job_ledger(job, start=start, end=end).goodput}
        cache.set(key, value, EXACT_CACHE_S)
    return value["goodput"]


def last_hour(job: TrainingJob, recent: dict | None, exact_left: int) -> dict | None:
    """The last hour's goodput as the page shows it: the figure, whether it is a lower
    bound, and in plain words why it is what it is (`note`, shown; `title`, on hover)."""
    if recent is None or recent["goodput"] is None:
        return None
    window = f"{RECENT_WINDOW_S / 60:.0f} min"
    out = {
        **recent,
        "note": "",
        "title": f"productive time / elapsed time over the job's last {window} (its own"
        " clock), as its ledger counts it: the current launch ran through all of it",
    }
    if not recent["lower_bound"]:
        return out
    if job.current_attempt_id is None:  # job_list's annotation: no query
        out["note"] = "no launch recorded: nothing counted as productive"
        out["title"] = "a lower bound: the job's events name no launch"
        return out
    began = job.first_event_ts is not None and job.first_event_ts >= recent["start"]
    what = "began inside the hour" if began else "restarted inside the hour"
    cheap = job.last_step is None or job.last_step <= EXACT_STEPS_MAX
    exact = _exact_recent(job, recent["start"], recent["end"]) if exact_left > 0 and cheap else None
    if exact is not None:
        out["goodput"] = exact
        out["lower_bound"] = False
        out["exact"] = True
        out["note"] = f"{what}: exact, from its ledger"
        out["title"] = (
            f"productive time / elapsed time over the job's last {window} (its own clock),"
            f" from its ledger over that window: the job {what}, so the launch before,"
            " the downtime and the restart are in it"
        )
        return out
    out["note"] = f"{what}: at least this; the time before the current launch is not counted"
    out["title"] = (
        f"a lower bound: the job {what}, and this page counts only the current launch's"
        f" steps in the last {window}, as if the time before it produced nothing. The"
        " job's page has the exact figure (its goodput over time, sliding hour)"
    )
    return out


def running_jobs() -> tuple[list[dict], int]:
    qs = jobs.job_list(status=TrainingJob.Status.RUNNING)
    page = list(qs[:JOBS_MAX])
    total = qs.count()
    recent = jobs.jobs_recent_goodput(jobs=page, window_s=RECENT_WINDOW_S)
    rows = []
    exact_left = EXACT_MAX
    now = timezone.now()
    for job in page:
        # The cached snapshot only (possibly a few seconds stale, refreshed after
        # ingest): a job whose ledger was never computed shows none rather than this
        # page computing it.
        cached = hasattr(job, "ledger")  # select_related: no query either way
        cumulative = jobs.job_goodput(job=job, allow_stale=True) if cached else None
        hour = last_hour(job, recent.get(job.pk), exact_left)
        exact_left -= bool(hour and hour.get("exact"))
        rows.append(
            {"job": job, "heard": job_heard(job, now), "cumulative": cumulative, "recent": hour}
        )
    return rows, total


@viewer_page
def page(request):
    incidents = incident_list().filter(state__in=Incident.OPEN_STATES)
    waiting = action_list(state=Action.State.AWAITING_APPROVAL)
    job_rows, jobs_total = running_jobs()
    open_incidents = list(incidents[:INCIDENTS_MAX])
    approvals = list(waiting[:APPROVALS_MAX])
    return render(
        request,
        "console/overview.html",
        {
            "clusters": node_grid(),
            "states": node_states(),
            "jobs": job_rows,
            "jobs_total": jobs_total,
            "incidents": open_incidents,
            "incidents_total": incidents.count(),
            "approvals": approvals,
            "approvals_total": waiting.count(),
            "lost": lost_recent(),
            "recent_window_min": int(RECENT_WINDOW_S // 60),
            "silent_after": span(jobs.job_silent_after_s()),
        },
    )


urls = [path("", page, name="overview")]
