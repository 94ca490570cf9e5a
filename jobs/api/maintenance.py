"""The maintenance windows API: viewers list and read them; operators declare and
cancel them (`/api/v1/maintenance`). The rules are jobs.services.maintenance's."""

from __future__ import annotations

from django.http import Http404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from common.errors import Invalid
from common.params import ID_MAX, bool_param
from jobs import selectors, services
from jobs.models import Cluster, MaintenanceWindow
from jobs.services.maintenance import MAX_LEAD_S, MAX_NODES


class MaintenanceWindowSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name")
    nodes = serializers.SerializerMethodField(help_text="node names; empty: the whole cluster")
    state = serializers.SerializerMethodField(help_text="active, upcoming, past or cancelled")

    class Meta:
        model = MaintenanceWindow
        fields = [
            "id",
            "cluster",
            "nodes",
            "starts_at",
            "ends_at",
            "reason",
            "state",
            "pre_action",
            "pre_action_lead_s",
            "pre_action_proposed_at",
            "created_by",
            "created_at",
            "cancelled_at",
        ]

    def get_nodes(self, obj) -> list[str]:
        return [n.name for n in obj.nodes.all()]

    def get_state(self, obj) -> str:
        return selectors.window_state(obj, self.context.get("now") or timezone.now())


class MaintenanceWindowCreateSerializer(serializers.Serializer):
    cluster = serializers.SlugField(max_length=100)
    nodes = serializers.ListField(
        child=serializers.CharField(max_length=128),
        required=False,
        max_length=MAX_NODES,
        help_text="node names of the cluster; none or empty: the whole cluster",
    )
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField(help_text="after starts_at, at most 31 days later")
    reason = serializers.CharField(max_length=300, required=False, allow_blank=True)
    pre_action = serializers.ChoiceField(
        choices=MaintenanceWindow.PreAction.choices,
        required=False,
        default=MaintenanceWindow.PreAction.NONE,
    )
    pre_action_lead_s = serializers.IntegerField(
        min_value=0, max_value=MAX_LEAD_S, required=False, default=600
    )


def _actor(request) -> str:
    return getattr(request.user, "username", "") or str(request.user)


def _window(pk) -> MaintenanceWindow:
    if pk > ID_MAX:  # beyond the id column: no such window
        raise Http404("No such maintenance window.")
    window = selectors.maintenance_window_list().filter(pk=pk).first()
    if window is None:
        raise Http404("No such maintenance window.")
    return window


@extend_schema(
    parameters=[
        OpenApiParameter("cluster", str),
        OpenApiParameter("active", bool, description="in force now (not cancelled)"),
        OpenApiParameter("upcoming", bool, description="not started yet (not cancelled)"),
    ]
)
class MaintenanceListView(generics.ListCreateAPIView):
    serializer_class = MaintenanceWindowSerializer
    parser_classes = [JSONParser]

    def get_queryset(self):
        r = self.request
        return selectors.maintenance_window_list(
            cluster=r.query_params.get("cluster") or None,
            active=bool_param(r, "active"),
            upcoming=bool_param(r, "upcoming"),
        )

    @extend_schema(
        request=MaintenanceWindowCreateSerializer,
        responses={
            201: MaintenanceWindowSerializer,
            400: OpenApiResponse(description="invalid: times, nodes, cluster"),
        },
        summary="Declare a maintenance window (operators)",
    )
    def post(self, request):
        form = MaintenanceWindowCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        d = form.validated_data
        cluster = Cluster.objects.filter(name=d["cluster"]).first()
        if cluster is None:
            raise Invalid(f"No cluster {d['cluster']!r}.", code="invalid", field="cluster")
        window = services.maintenance_window_create(
            cluster=cluster,
            starts_at=d["starts_at"],
            ends_at=d["ends_at"],
            nodes=d.get("nodes") or [],
            reason=d.get("reason", ""),
            pre_action=d["pre_action"],
            pre_action_lead_s=d["pre_action_lead_s"],
            created_by=_actor(request),
        )
        body = MaintenanceWindowSerializer(_window(window.pk)).data
        return Response(body, status=status.HTTP_201_CREATED)


class MaintenanceDetailView(APIView):
    @extend_schema(responses={200: MaintenanceWindowSerializer, 404: OpenApiResponse()})
    def get(self, request, pk):
        return Response(MaintenanceWindowSerializer(_window(pk)).data)


class MaintenanceCancelView(APIView):
    required_role = "operator"

    @extend_schema(
        request=None,
        responses={
            200: MaintenanceWindowSerializer,
            404: OpenApiResponse(description="no such window"),
            409: OpenApiResponse(description="invalid_state: cancelled already"),
        },
        summary="Cancel a maintenance window: what it covered is judged as unplanned again",
    )
    def post(self, request, pk):
        services.maintenance_window_cancel(window=_window(pk), actor=_actor(request))
        return Response(MaintenanceWindowSerializer(_window(pk)).data)
