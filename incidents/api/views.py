"""The incidents API: list and detail for viewers; resolve and notes for operators."""

from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.response import Response
from rest_framework.views import APIView

from incidents import selectors, services
from incidents.api import serializers as s
from incidents.models import Incident
from jobs.api.params import choice_param, time_param
from jobs.services import dt


@extend_schema(
    parameters=[
        OpenApiParameter("job", str),
        OpenApiParameter("cluster", str),
        OpenApiParameter("cause", str, enum=Incident.Cause.values),
        OpenApiParameter("state", str, enum=Incident.State.values),
        OpenApiParameter("since", str, description="faults at or after (RFC 3339 or unix s)"),
        OpenApiParameter("until", str, description="faults before (RFC 3339 or unix s)"),
    ]
)
class IncidentListView(generics.ListAPIView):
    serializer_class = s.IncidentSerializer

    def get_queryset(self):
        r = self.request
        return selectors.incident_list(
            job=r.query_params.get("job") or None,
            cluster=r.query_params.get("cluster") or None,
            cause=choice_param(r, "cause", Incident.Cause.values),
            state=choice_param(r, "state", Incident.State.values),
            since=_when(r, "since"),
            until=_when(r, "until"),
        )


def _when(request, name):
    ts = time_param(request, name)
    return None if ts is None else dt(ts)


def _incident(pk) -> Incident:
    incident = selectors.incident_detail(pk=pk)
    if incident is None:
        raise Http404("No such incident.")
    return incident


def _actor(request) -> str:
    return getattr(request.user, "username", "") or str(request.user)


class IncidentDetailView(APIView):
    required_roles = {"GET": "viewer", "PATCH": "operator"}

    @extend_schema(responses=s.IncidentDetailSerializer)
    def get(self, request, pk):
        return Response(s.IncidentDetailSerializer(_incident(pk)).data)

    @extend_schema(request=s.IncidentNotesSerializer, responses=s.IncidentDetailSerializer)
    def patch(self, request, pk):
        incident = _incident(pk)
        form = s.IncidentNotesSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        services.incident_update_notes(
            incident=incident, actor=_actor(request), **form.validated_data
        )
        return Response(s.IncidentDetailSerializer(_incident(pk)).data)


class IncidentResolveView(APIView):
    required_role = "operator"

    @extend_schema(request=s.IncidentResolveSerializer, responses=s.IncidentDetailSerializer)
    def post(self, request, pk):
        incident = _incident(pk)
        form = s.IncidentResolveSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        services.incident_resolve(
            incident=incident, actor=_actor(request), note=form.validated_data.get("note", "")
        )
        return Response(s.IncidentDetailSerializer(_incident(pk)).data)
