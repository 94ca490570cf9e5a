"""The maintenance page: each cluster's current, upcoming and past maintenance
windows with their nodes, and for operators a form to declare one and a button to
cancel one. The rules are jobs.services.maintenance's, as the REST API's
(/api/v1/maintenance) are."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.shortcuts import render
from django.urls import path, reverse
from django.utils import timezone

from common.api import status_of
from common.errors import AppError
from console.pages.common import answer, can_operate, operator_post, viewer_page
from jobs import selectors, services
from jobs.models import Cluster, MaintenanceWindow
from jobs.services.maintenance import MAX_LEAD_S

PAST_SHOWN = 20  # past and cancelled windows listed per cluster, newest first


class WindowForm(forms.Form):
    cluster = forms.ChoiceField(choices=[])
    starts_at = forms.DateTimeField(help_text="UTC, e.g. 2026-12-04 08:00")
    ends_at = forms.DateTimeField(help_text="UTC")
    nodes = forms.CharField(
        required=False,
        max_length=100_000,
        help_text="node names, separated by spaces or commas; empty: the whole cluster",
    )
    reason = forms.CharField(required=False, max_length=300)
    pre_action = forms.ChoiceField(choices=MaintenanceWindow.PreAction.choices, required=False)
    pre_action_lead_s = forms.IntegerField(
        required=False, min_value=0, max_value=MAX_LEAD_S, initial=600
    )

    def __init__(self, *args, clusters=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["cluster"].choices = [(c, c) for c in clusters]

    def node_names(self) -> list[str]:
        raw = self.cleaned_data.get("nodes") or ""
        return [n for n in raw.replace(",", " ").split() if n]


@viewer_page
def maintenance_page(request):
    now = timezone.now()
    clusters = list(Cluster.objects.order_by("name").values_list("name", flat=True))
    cluster = request.GET.get("cluster") or None
    windows = list(selectors.maintenance_window_list(cluster=cluster, now=now)[:500])
    groups: dict[str, dict] = {}
    for w in windows:
        state = selectors.window_state(w, now)
        g = groups.setdefault(
            w.cluster.name, {"cluster": w.cluster.name, "active": [], "upcoming": [], "past": []}
        )
        bucket = "past" if state in ("past", "cancelled") else state
        if bucket == "past" and len(g["past"]) >= PAST_SHOWN:
            continue
        g[bucket].append({"w": w, "state": state, "nodes": [n.name for n in w.nodes.all()]})
    for g in groups.values():
        g["upcoming"].reverse()  # soonest first
    start = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    form = WindowForm(
        clusters=clusters,
        initial={
            "cluster": cluster or (clusters[0] if clusters else ""),
            "starts_at": start.strftime("%Y-%m-%d %H:%M"),
            "ends_at": (start + timedelta(hours=2)).strftime("%Y-%m-%d %H:%M"),
            "pre_action_lead_s": 600,
        },
    )
    return render(
        request,
        "console/maintenance.html",
        {
            "clusters": clusters,
            "cluster": cluster,
            "groups": [groups[name] for name in sorted(groups)],
            "form": form,
            "can_operate": can_operate(request),
            "now": now,
        },
    )


@operator_post
def maintenance_declare(request):
    back = reverse("console:maintenance")
    clusters = list(Cluster.objects.order_by("name").values_list("name", flat=True))
    form = WindowForm(request.POST, clusters=clusters)
    if not form.is_valid():
        problems = "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())
        return answer(request, False, f"Not declared: {problems}", status=400, back=back)
    d = form.cleaned_data
    try:
        window = services.maintenance_window_create(
            cluster=Cluster.objects.get(name=d["cluster"]),
            starts_at=d["starts_at"],
            ends_at=d["ends_at"],
            nodes=form.node_names(),
            reason=d.get("reason") or "",
            pre_action=d.get("pre_action") or MaintenanceWindow.PreAction.NONE,
            pre_action_lead_s=600 if d.get("pre_action_lead_s") is None else d["pre_action_lead_s"],
            created_by=request.user.username,
        )
    except AppError as exc:
        return answer(
            request, False, f"Not declared: {exc.detail}", status=status_of(exc), back=back
        )
    return answer(
        request, True, f"Maintenance window #{window.pk} declared.", back=back, window=window.pk
    )


@operator_post
def maintenance_cancel(request, pk):
    back = reverse("console:maintenance")
    window = MaintenanceWindow.objects.filter(pk=pk).first() if pk < 2**63 else None
    if window is None:
        return answer(request, False, "No such maintenance window.", status=404, back=back)
    try:
        services.maintenance_window_cancel(window=window, actor=request.user.username)
    except AppError as exc:
        return answer(request, False, exc.detail, status=status_of(exc), back=back)
    return answer(request, True, f"Maintenance window #{pk} cancelled.", back=back)


urls = [
    path("maintenance/", maintenance_page, name="maintenance"),
    path("maintenance/declare/", maintenance_declare, name="maintenance-declare"),
    path("maintenance/<int:pk>/cancel/", maintenance_cancel, name="maintenance-cancel"),
]
