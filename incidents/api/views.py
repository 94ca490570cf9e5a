"""The incidents API: list and detail for viewers; resolve and notes for operators."""

from datetime import timedelta

from django.http import Http404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.response import Response
from rest_framework.views import APIView

from console.exceptions import ApiError
from incidents import selectors, services
from incidents.api import serializers as s
from incidents.models import Incident
from jobs.api.params import choice_param, time_param
from jobs.models import Node, TrainingJob
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


RELIABILITY_DEFAULT_DAYS = 30


class ReliabilityView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("cluster", str),
            OpenApiParameter("start", str, description="default: 30 days before end"),
            OpenApiParameter("end", str, description="default: now"),
        ],
        responses=s.ReliabilitySerializer,
    )
    def get(self, request):
        end = _when(request, "end") or timezone.now()
        start = _when(request, "start") or end - timedelta(days=RELIABILITY_DEFAULT_DAYS)
        if end <= start:
            raise ApiError(400, "invalid_parameter", "end must be after start.", field="end")
        figures = selectors.reliability(
            cluster=request.query_params.get("cluster") or None, start=start, end=end
        )
        return Response(s.ReliabilitySerializer(figures).data)


@extend_schema(
    parameters=[
        OpenApiParameter("cluster", str),
        OpenApiParameter("state", str, enum=Node.State.values),
    ]
)
class NodeListView(generics.ListAPIView):
    serializer_class = s.NodeSerializer

    def get_queryset(self):
        r = self.request
        return selectors.node_list(
            cluster=r.query_params.get("cluster") or None,
            state=choice_param(r, "state", Node.State.values),
        )


class JobRanksView(APIView):
    """The latest complete window of the job's current launch, scored per rank and node."""

    @extend_schema(responses=s.JobRanksSerializer)
    def get(self, request, key):
        job = TrainingJob.objects.filter(key=key).first()
        if job is None:
            raise Http404("No such job.")
        return Response(s.JobRanksSerializer(selectors.job_rank_scores(job=job)).data)
