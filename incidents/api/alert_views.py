"""Alertmanager in: its webhook (an ingest token of the cluster), the alerts received
(viewers) and the cluster's alert mapping (viewers read, operators change)."""

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from common.errors import PermissionDenied
from common.params import choice_param
from incidents import alerts, selectors
from incidents.api import alert_serializers as s
from incidents.api.views import _actor, _settings_scope
from incidents.models import Alert
from incidents.settings import alert_settings_table, alert_settings_update
from jobs.api.views import _read_body


class AlertmanagerWebhookView(APIView):
    """Alertmanager's webhook (payload version 4): each alert recorded once per
    (fingerprint, startsAt), mapped to a node and a fault; a firing one opens or joins
    the incident of each job on its node, a resolved one resolves what it alone opened."""

    required_role = "ingest"
    parser_classes = [JSONParser]

    @extend_schema(
        request={"application/json": s.WebhookSerializer},
        parameters=[
            OpenApiParameter(
                "cluster",
                str,
                description="the cluster the alerts are about: refused (403) unless it is"
                " the token's own; default: the token's",
            )
        ],
        responses={
            200: s.WebhookResponseSerializer,
            400: OpenApiResponse(
                description="not Alertmanager's payload: `errors` names each field and"
                " why; nothing was stored"
            ),
            403: OpenApiResponse(description="not an ingest token, or one of another cluster"),
            413: OpenApiResponse(description="more than 5 MiB"),
            415: OpenApiResponse(description="a Content-Encoding other than gzip"),
        },
        summary="Alertmanager's webhook: alerts become faults of the jobs on their nodes",
    )
    def post(self, request):
        cluster = request.auth.cluster
        named = request.query_params.get("cluster")
        if named is not None and named != cluster.name:
            raise PermissionDenied(
                f"This token's cluster '{cluster.name}' may not post alerts for"
                f" cluster '{named[:100]}'.",
                code="forbidden_cluster",
            )
        parsed = alerts.webhook_parse(_read_body(request))  # InvalidAlerts: a 400
        receipts = alerts.alerts_receive(cluster=cluster, alerts=parsed)
        counts = {w: sum(1 for r in receipts if r.what == w) for w in ("new", "resolved", "repeat")}
        records = selectors.alert_list().filter(pk__in=[r.alert.pk for r in receipts])
        return Response(
            {
                "received": len(parsed),
                "new": counts["new"],
                "resolved": counts["resolved"],
                "repeats": counts["repeat"],
                "alerts": s.AlertSerializer(records, many=True).data,
            }
        )


@extend_schema(
    parameters=[
        OpenApiParameter("cluster", str),
        OpenApiParameter("status", str, enum=Alert.Status.values),
        OpenApiParameter("node", str, description="the node, as matched or as labelled"),
    ],
    summary="Alerts received from Alertmanager, the most recently heard first",
)
class AlertListView(generics.ListAPIView):
    serializer_class = s.AlertSerializer

    def get_queryset(self):
        r = self.request
        return selectors.alert_list(
            cluster=r.query_params.get("cluster") or None,
            status=choice_param(r, "status", Alert.Status.values),
            node=r.query_params.get("node") or None,
        )


def _settings_response(cluster) -> Response:
    return Response(s.AlertSettingSerializer(alert_settings_table(cluster=cluster), many=True).data)


class AlertSettingsView(APIView):
    """How a cluster maps alerts to nodes and faults (docs/alertmanager.md)."""

    required_roles = {"GET": "viewer", "PATCH": "operator"}
    parser_classes = [JSONParser]

    @extend_schema(
        summary="A cluster's alert mapping: node labels, rules, what an unmatched alert is",
        parameters=[OpenApiParameter("cluster", {"type": "string", "minLength": 1}, required=True)],
        responses={
            200: s.AlertSettingSerializer(many=True),
            400: OpenApiResponse(description="no cluster"),
            404: OpenApiResponse(description="no such cluster"),
        },
    )
    def get(self, request):
        cluster, _ = _settings_scope(request.query_params.get("cluster"), None)
        return _settings_response(cluster)

    @extend_schema(
        summary="Set or remove (null) a cluster's alert settings, all or nothing",
        request=s.AlertSettingsUpdateSerializer,
        responses={
            200: s.AlertSettingSerializer(many=True),
            400: OpenApiResponse(description="invalid values, each named with its reason"),
            404: OpenApiResponse(description="no such cluster"),
        },
    )
    def patch(self, request):
        form = s.AlertSettingsUpdateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        cluster, _ = _settings_scope(form.validated_data["cluster"], None)
        # Invalid values raise InvalidSettings: a 400 naming each (common.api).
        alert_settings_update(
            cluster=cluster, values=form.validated_data["values"], actor=_actor(request)
        )
        return _settings_response(cluster)
