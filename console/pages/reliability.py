"""The reliability report: for a cluster (or all) and a period, how often jobs fail,
why, how fast they come back, what it cost, which nodes keep failing, and the
goodput week by week. The figures are incidents.selectors.reliability's, as the
REST endpoint /api/v1/reliability gives them."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from django import forms
from django.shortcuts import render
from django.urls import path
from django.utils import timezone

from console.charts import chart_script
from console.charts.reliability import (
    FAILURES_COLOUR,
    LOST_COLOUR,
    cause_figure,
    cause_label,
    goodput_by_week_figure,
)
from console.pages.common import viewer_page
from console.pages.incidents import ClusterPeriodForm, duration
from incidents import selectors
from jobs.models import Cluster
from recovery.selectors import phases_summary

DEFAULT_PRESET = f"{selectors.RELIABILITY_DEFAULT_DAYS}d"  # the API's default period
PRESETS = {"7d": 7, "30d": 30, "90d": 90}
PRESET_LABELS = {"7d": "last 7 days", "30d": "last 30 days", "90d": "last 90 days"}
MAX_DAYS = 3 * 366  # a longer period is refused: its weeks would be unreadable anyway


class PeriodForm(ClusterPeriodForm):
    """The menu always names the period shown: the default preset when neither a preset
    nor dates are asked for, and no dates left in the form when a preset wins over them."""

    range = forms.ChoiceField(
        required=False, choices=[("", "the dates below"), *PRESET_LABELS.items()], label="Period"
    )
    field_order = ["cluster", "range", "since", "until"]

    def __init__(self, data=None, *args, **kwargs):
        if data is not None:
            data = data.copy()
            if data.get("range"):
                data["since"] = data["until"] = ""
            elif not (data.get("since") or data.get("until")):
                data["range"] = DEFAULT_PRESET
        kwargs.setdefault("initial", {"range": DEFAULT_PRESET})
        super().__init__(data, *args, **kwargs)

    def clean(self):
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        too_long = since and (until or timezone.now().date()) - since > timedelta(days=MAX_DAYS)
        if too_long and not self.has_error("until"):
            self.add_error("since", f"At most {MAX_DAYS} days.")
        return data

    def period(self, now: datetime) -> tuple[str | None, datetime, datetime, str]:
        """(cluster, start, end, what to call the period). Dates are whole UTC days,
        `until` included; a preset wins over them; nothing valid: the default preset."""
        d = self.cleaned_data if self.is_bound else {}
        cluster = d.get("cluster") or None
        preset = d.get("range") or ""
        since, until = d.get("since"), d.get("until")
        if preset or not (since or until):
            preset = preset or DEFAULT_PRESET
            return cluster, now - timedelta(days=PRESETS[preset]), now, PRESET_LABELS[preset]
        end = _day(until, 1) if until else now
        start = _day(since) if since else end - timedelta(days=PRESETS[DEFAULT_PRESET])
        return cluster, start, end, f"{start:%Y-%m-%d} to {end - timedelta(seconds=1):%Y-%m-%d}"


def _day(value, plus: int = 0) -> datetime:
    return datetime.combine(value + timedelta(days=plus), time.min, tzinfo=UTC)


@viewer_page
def reliability(request):
    clusters = list(Cluster.objects.order_by("name").values_list("name", flat=True))
    form = PeriodForm(request.GET or None, clusters=clusters)
    if form.is_bound:
        form.is_valid()  # the valid fields choose; the errors are shown
    cluster, start, end, period = form.period(timezone.now())
    report = selectors.reliability(cluster=cluster, start=start, end=end)
    goodput = selectors.goodput_by_week(cluster=cluster, start=start, end=end)
    offenders = report["repeat_offenders"]
    where = selectors.node_clusters(names=[o["node"] for o in offenders], cluster=cluster)
    total_lost = report["lost_gpu_hours"]
    causes = [
        {
            "cause": cause_label(cause),
            **figures,
            "lost_share": figures["lost_gpu_hours"] / total_lost if total_lost else 0.0,
        }
        for cause, figures in report["by_cause"].items()
    ]
    times = [
        {"name": name, "count": report[key]["count"]}
        | {k: duration(report[key][k]) for k in ("mean_s", "p50_s", "p90_s")}
        for name, key in (
            ("Time to resume", "time_to_resume"),
            ("Time to recover", "time_to_recover"),
        )
    ]
    by_cause = report["by_cause"]
    phases = phases_summary(
        list(
            selectors.incident_list(cluster=cluster, since=start, until=end).prefetch_related(None)
        )
    )
    return render(
        request,
        "console/reliability.html",
        {
            "form": form,
            "presets": PRESET_LABELS,
            "period": period,
            "cluster": cluster,
            "report": report,
            "goodput": goodput,
            "weeks": [
                {**w, "pct": None if w["goodput"] is None else 100.0 * w["goodput"]}
                for w in goodput["weeks"]
            ],
            "min_incidents": selectors.REPEAT_OFFENDER_MIN,
            "failure_definition": selectors.FAILURE_DEFINITION,
            "mtbf": duration(report["mtbf_s"]),
            "times": times,
            "phases": [
                {**p, "mean": duration(p["mean_s"]) if p["mean_s"] is not None else "—"}
                for p in phases["phases"]
            ],
            "people_share": phases["people_share"],
            "causes": causes,
            "offenders": [{**o, "clusters": where.get(o["node"], [])} for o in offenders],
            "failures_chart": chart_script(
                cause_figure(
                    by_cause, "failures", "Failures by cause", "failures", ":d", FAILURES_COLOUR
                ),
                "failures-chart",
            ),
            "lost_chart": chart_script(
                cause_figure(
                    by_cause,
                    "lost_gpu_hours",
                    "Lost GPU-hours by cause",
                    "GPU-hours",
                    ":.2f",
                    LOST_COLOUR,
                ),
                "lost-chart",
            ),
            "goodput_chart": chart_script(
                goodput_by_week_figure(goodput["weeks"]), "goodput-chart"
            ),
        },
    )


urls = [path("reliability/", reliability, name="reliability")]
