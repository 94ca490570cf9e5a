"""The incidents pages: every incident, filtered and paginated, and one incident in
depth (its times, lost compute, timeline and the actions that answer it), where
operators write its root cause and postmortem and resolve it."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from urllib.parse import quote

from django import forms
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, render
from django.urls import path, reverse
from django.utils import timezone
from django.utils.http import RFC3986_SUBDELIMS

from console.charts import OKABE_ITO, chart_script
from console.charts.incidents import LOST_COLOURS, lost_figure, timeline_figure
from console.pages.common import DayField, answer, can_operate, operator_post, viewer_page
from incidents import selectors, services
from incidents.api.serializers import POSTMORTEM_MAX, RESOLVE_NOTE_MAX, ROOT_CAUSE_MAX
from incidents.costs import attach_costs
from incidents.models import Incident
from jobs.models import Cluster
from recovery.models import Action
from recovery.selectors import action_list, incident_phases

PER_PAGE = 100
ACTIONS_MAX = 100
PRESETS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
PRESET_LABELS = {"24h": "last 24 h", "7d": "last 7 days", "30d": "last 30 days"}


def duration(seconds: float | None) -> str:
    """A duration for people: 42 s, 3 min 05 s, 2 h 07 min, 3 d 04 h."""
    if seconds is None:
        return "—"
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 60:
        return f"{sign}{s:.1f} s" if s < 10 else f"{sign}{s:.0f} s"
    m, s = divmod(round(s), 60)
    if m < 60:
        return f"{sign}{m} min {s:02d} s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{sign}{h} h {m:02d} min"
    d, h = divmod(h, 24)
    return f"{sign}{d} d {h:02d} h"


def _choices(values, blank: str) -> list[tuple[str, str]]:
    return [("", blank)] + [(v, v.replace("_", " ")) for v in values]


class ClusterPeriodForm(forms.Form):
    """A cluster and a period in whole UTC days (From and To, To included); the
    incidents list and the reliability report both filter by them."""

    cluster = forms.ChoiceField(required=False)
    since = DayField(required=False, label="From", widget=forms.DateInput({"type": "date"}))
    until = DayField(required=False, label="To", widget=forms.DateInput({"type": "date"}))

    def __init__(self, *args, clusters: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["cluster"].choices = [("", "all clusters")] + [(c, c) for c in clusters]

    def clean(self):
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and until < since:
            self.add_error("until", "The end comes before the start.")
        return data


class IncidentFilter(ClusterPeriodForm):
    job = forms.SlugField(required=False, max_length=100)
    cause = forms.ChoiceField(required=False, choices=_choices(Incident.Cause.values, "any cause"))
    state = forms.ChoiceField(required=False, choices=_choices(Incident.State.values, "any state"))
    range = forms.ChoiceField(
        required=False, choices=[("", "any time"), *PRESET_LABELS.items()], label="Period"
    )
    field_order = ["cluster", "job", "cause", "state", "range", "since", "until"]

    def filters(self, now: datetime) -> dict:
        """incident_list's arguments from the valid fields (an invalid one is shown and
        ignored). Dates are whole UTC days, `until` included; a preset wins over them."""
        d = self.cleaned_data if self.is_bound else {}
        out = {k: d.get(k) or None for k in ("cluster", "job", "cause", "state")}
        if d.get("range"):
            out["since"], out["until"] = now - PRESETS[d["range"]], None
        else:
            out["since"] = _day(d.get("since"))
            out["until"] = _day(d.get("until"), 1)
        return out


def _day(value, plus: int = 0) -> datetime | None:
    if value is None:
        return None
    return datetime.combine(value + timedelta(days=plus), time.min, tzinfo=UTC)


_SAFE = RFC3986_SUBDELIMS + "~:@"  # what reverse() leaves unquoted in a path


class _Links:
    """Row links at the cost of one reverse() per pattern, not one per link (a page
    of 100 incidents has some 400)."""

    MARK = "98765432{}0"  # digits: every path converter (int, slug, str) takes them

    def __init__(self):
        self._patterns = {}

    def __call__(self, name: str, *args) -> str:
        pattern = self._patterns.get(name)
        if pattern is None:
            marks = [self.MARK.format(k) for k in range(len(args))]
            pattern = self._patterns[name] = reverse(f"console:{name}", args=marks)
        for k, arg in enumerate(args):
            pattern = pattern.replace(self.MARK.format(k), quote(str(arg), safe=_SAFE))
        return pattern


def _when(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if at else "—"


def _row(incident: Incident, link: _Links) -> dict:
    cluster = incident.cluster.name
    return {
        "incident": incident,
        "url": link("incident-detail", incident.pk),
        "job_url": link("job-detail", incident.job.key),
        "cause": incident.cause.replace("_", " "),
        "nodes": sorted(
            (n.name, link("node-detail", cluster, n.name)) for n in incident.nodes.all()
        ),
        "fault": _when(incident.fault_at),
        "opened": _when(incident.opened_at),
        "lost": f"{incident.lost_gpu_hours:.2f}",
        "ttd": duration(incident.time_to_detect_s),
        "ttr": duration(incident.time_to_resume_s),
        "ttrec": duration(incident.time_to_recover_s),
    }


@viewer_page
def incident_list(request):
    clusters = list(Cluster.objects.order_by("name").values_list("name", flat=True))
    form = IncidentFilter(request.GET or None, clusters=clusters)
    if form.is_bound:
        form.is_valid()  # the valid fields filter; the errors are shown
    incidents = selectors.incident_list(**form.filters(timezone.now()))
    page = Paginator(incidents, PER_PAGE).get_page(request.GET.get("page"))
    attach_costs(page.object_list)  # the page's prices read once, not per row
    link = _Links()
    return render(
        request,
        "console/incident_list.html",
        {
            "form": form,
            "page": page,
            "rows": [_row(i, link) for i in page.object_list],
            "presets": PRESET_LABELS,
        },
    )


def _clock_ahead(incident: Incident) -> str | None:
    """How far the job's clock runs ahead of Rebound's, when an incident was opened
    (Rebound's clock) before it was detected (the job's): None when it was not."""
    ahead = (incident.detected_at - incident.opened_at).total_seconds()
    return duration(ahead) if ahead > 0 else None


def _actions(incident: Incident) -> tuple[list[Action], int]:
    qs = action_list(incident=incident.pk)
    rows = list(qs[: ACTIONS_MAX + 1])
    if len(rows) <= ACTIONS_MAX:
        return rows, len(rows)
    return rows[:ACTIONS_MAX], qs.count()


@viewer_page
def incident_detail(request, pk):
    incident = selectors.incident_list().filter(pk=pk).first()
    if incident is None:
        raise Http404("No such incident.")
    attach_costs([incident])
    timeline = selectors.incident_timeline(incident=incident)
    entries = timeline["head"] + timeline["tail"]
    actions, actions_total = _actions(incident)
    breakdown = [
        {
            "name": name.replace("_", " "),
            "gpu_hours": gpu_s / 3600.0,
            "colour": LOST_COLOURS.get(name, OKABE_ITO["grey"]),
        }
        for name, gpu_s in (incident.lost_breakdown or {}).items()
    ]
    return render(
        request,
        "console/incident_detail.html",
        {
            "incident": incident,
            "phases": _phases(incident),
            "row": _row(incident, _Links()),
            "timeline": timeline,
            "shown": len(entries),
            "timeline_chart": chart_script(timeline_figure(entries), "timeline-chart"),
            "lost_chart": chart_script(lost_figure(incident), "lost-chart"),
            "breakdown": breakdown,
            "actions": actions,
            "actions_total": actions_total,
            "can_operate": can_operate(request),
            "resolved": incident.state == Incident.State.RESOLVED,
            "clock_ahead": _clock_ahead(incident),
        },
    )


PHASE_COLOURS = {
    "detecting": OKABE_ITO["grey"],
    "waiting_for_approval": OKABE_ITO["vermillion"],
    "queued": OKABE_ITO["yellow"],
    "acting": OKABE_ITO["blue"],
    "relaunching": OKABE_ITO["orange"],
    "restarting": OKABE_ITO["sky"],
    "catching_up": OKABE_ITO["green"],
}


def _phases(incident: Incident) -> dict:
    """The incident's recovery phases for the page's bar and table (breakdown rows in
    the shape of _bar.html)."""
    figures = incident_phases(incident)
    total = sum(p["seconds"] or 0.0 for p in figures["phases"])
    rows = [
        {
            **p,
            "text": duration(p["seconds"]) if p["seconds"] is not None else "not reached",
            "share": (p["seconds"] or 0.0) / total if total else 0.0,
            "colour": PHASE_COLOURS[p["phase"]],
        }
        for p in figures["phases"]
    ]
    return {
        **figures,
        "rows": rows,
        "total": duration(total),
        "people": duration(figures["people_s"]),
        "machines": duration(figures["machines_s"]),
    }


class NotesForm(forms.Form):
    # The API's limits (incidents.api.serializers.IncidentNotesSerializer).
    root_cause = forms.CharField(required=False, max_length=ROOT_CAUSE_MAX, strip=False)
    postmortem = forms.CharField(required=False, max_length=POSTMORTEM_MAX, strip=False)


class ResolveForm(forms.Form):
    note = forms.CharField(required=False, max_length=RESOLVE_NOTE_MAX)


def _first_error(form: forms.Form) -> str:
    name, errors = next(iter(form.errors.items()))
    return f"{name.replace('_', ' ')}: {errors[0]}"


@operator_post
def incident_notes(request, pk):
    incident = get_object_or_404(Incident, pk=pk)
    back = reverse("console:incident-detail", args=[pk])
    form = NotesForm(request.POST)
    if not form.is_valid():
        return answer(request, False, _first_error(form), status=400, back=back)
    # A field the form did not send is left as it is.
    notes = {f: form.cleaned_data[f] for f in ("root_cause", "postmortem") if f in request.POST}
    services.incident_update_notes(incident=incident, actor=request.user.get_username(), **notes)
    return answer(request, True, "Notes saved.", back=back)


@operator_post
def incident_resolve(request, pk):
    incident = get_object_or_404(Incident, pk=pk)
    back = reverse("console:incident-detail", args=[pk])
    form = ResolveForm(request.POST)
    if not form.is_valid():
        return answer(request, False, _first_error(form), status=400, back=back)
    if incident.state == Incident.State.RESOLVED:
        return answer(request, True, "Already resolved.", back=back, state=incident.state)
    incident = services.incident_resolve(
        incident=incident, actor=request.user.get_username(), note=form.cleaned_data["note"]
    )
    return answer(request, True, f"Incident #{pk} resolved.", back=back, state=incident.state)


urls = [
    path("incidents/", incident_list, name="incident-list"),
    path("incidents/<int:pk>/", incident_detail, name="incident-detail"),
    path("incidents/<int:pk>/notes/", incident_notes, name="incident-notes"),
    path("incidents/<int:pk>/resolve/", incident_resolve, name="incident-resolve"),
]
