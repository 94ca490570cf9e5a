"""The incidents API: list and detail for viewers; resolve and notes for operators;
detector settings per cluster and job, read by viewers and changed by operators."""

from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from common.errors import Invalid, NotFound
from common.params import bool_param, choice_param, int_param, period_params, time_param
from common.time import dt
from incidents import selectors, services
from incidents.api import serializers as s
from incidents.costs import attach_costs
from incidents.models import Incident
from incidents.settings import detector_settings_table, detector_settings_update
from jobs.api.serializers import TIME_SCHEMA
from jobs.models import Cluster, Node, TrainingJob


@extend_schema(
    parameters=[
        OpenApiParameter("job", str),
        OpenApiParameter("cluster", str),
        OpenApiParameter("cause", str, enum=Incident.Cause.values),
        OpenApiParameter("state", str, enum=Incident.State.values),
        OpenApiParameter("since", TIME_SCHEMA, description="faults at or after"),
        OpenApiParameter("until", TIME_SCHEMA, description="faults before"),
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

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        attach_costs(page or [])  # the page's prices read once, not per row
        return page


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


class ReliabilityView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("cluster", str),
            OpenApiParameter("start", TIME_SCHEMA, description="default: 30 days before end"),
            OpenApiParameter("end", TIME_SCHEMA, description="default: now"),
        ],
        responses=s.ReliabilitySerializer,
    )
    def get(self, request):
        start, end = period_params(request, default_days=selectors.RELIABILITY_DEFAULT_DAYS)
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


RANKS_LIMIT_DEFAULT = 100
RANKS_LIMIT_MAX = 1000
RANKS_OFFSET_MAX = 2**31 - 1


class JobRanksView(APIView):
    """The latest complete window of the job's current launch, scored per rank and node,
    a page at a time (a launch may have tens of thousands of ranks)."""

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "order",
                str,
                enum=selectors.RANK_ORDERS,
                description="`slowest` (default): the lowest of a rank's two scores first;"
                " `rank`: by rank",
            ),
            OpenApiParameter(
                "slow",
                str,
                enum=["true", "false"],
                description="`true`: only the slow ranks; `false`: the others",
            ),
            OpenApiParameter("node", str, description="only the ranks on this node"),
            OpenApiParameter(
                "limit",
                {"type": "integer", "minimum": 1, "maximum": RANKS_LIMIT_MAX},
                description=f"ranks per page (default {RANKS_LIMIT_DEFAULT})",
            ),
            OpenApiParameter(
                "offset",
                {"type": "integer", "minimum": 0, "maximum": RANKS_OFFSET_MAX},
                description="matching ranks skipped before the page (default 0)",
            ),
        ],
        responses=s.JobRanksSerializer,
    )
    def get(self, request, key):
        paging = {
            "order": choice_param(request, "order", selectors.RANK_ORDERS) or "slowest",
            "slow": bool_param(request, "slow"),
            "node": request.query_params.get("node") or None,
            "limit": int_param(
                request, "limit", default=RANKS_LIMIT_DEFAULT, minimum=1, maximum=RANKS_LIMIT_MAX
            ),
            "offset": int_param(request, "offset", default=0, minimum=0, maximum=RANKS_OFFSET_MAX),
        }
        job = TrainingJob.objects.filter(key=key).first()
        if job is None:
            raise Http404("No such job.")
        scores = services.job_rank_scores_ensure(job=job)
        return Response(s.JobRanksSerializer(selectors.rank_scores_page(scores, **paging)).data)


def _settings_scope(cluster_name: str | None, job_key: str | None):
    """The cluster and (optional) job named: 404 for an unknown one, 400 for a job
    of another cluster."""
    if not cluster_name:
        raise Invalid("cluster is required.", code="invalid_parameter", field="cluster")
    cluster = Cluster.objects.filter(name=cluster_name).first()
    if cluster is None:
        raise NotFound(f"No such cluster: {cluster_name}.", field="cluster")
    if not job_key:
        return cluster, None
    job = TrainingJob.objects.select_related("cluster").filter(key=job_key).first()
    if job is None:
        raise NotFound(f"No such job: {job_key}.", field="job")
    if job.cluster_id != cluster.pk:
        raise Invalid(
            f"Job {job_key} runs on cluster {job.cluster.name}, not {cluster_name}.",
            code="invalid_parameter",
            field="job",
        )
    return cluster, job


def _settings_response(cluster, job) -> Response:
    table = detector_settings_table(cluster=cluster, job=job)
    return Response(s.DetectorSettingSerializer(table, many=True).data)


class DetectorSettingsView(APIView):
    """Every detector parameter of a cluster (or job): its default, overrides and the
    value in force. Detectors read them on every pass: a change applies at once."""

    required_roles = {"GET": "viewer", "PATCH": "operator"}
    parser_classes = [JSONParser]

    @extend_schema(
        summary="The parameters in force for a cluster, or one of its jobs",
        parameters=[
            OpenApiParameter("cluster", {"type": "string", "minLength": 1}, required=True),
            OpenApiParameter("job", str, description="a job of that cluster: its overrides too"),
        ],
        responses={
            200: s.DetectorSettingSerializer(many=True),
            400: OpenApiResponse(description="no cluster, or a job of another cluster"),
            404: OpenApiResponse(description="no such cluster or job"),
        },
    )
    def get(self, request):
        params = request.query_params
        return _settings_response(*_settings_scope(params.get("cluster"), params.get("job")))

    @extend_schema(
        summary="Set or remove (null) a cluster's or a job's overrides, all or nothing",
        request=s.DetectorSettingsUpdateSerializer,
        responses={
            200: s.DetectorSettingSerializer(many=True),
            400: OpenApiResponse(
                description="invalid values, each named with its reason; nothing was changed"
            ),
            404: OpenApiResponse(description="no such cluster or job"),
        },
    )
    def patch(self, request):
        form = s.DetectorSettingsUpdateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        cluster, job = _settings_scope(data["cluster"], data.get("job"))
        # Invalid values raise InvalidSettings: a 400 naming each (common.api).
        detector_settings_update(
            cluster=cluster, job=job, values=data["values"], actor=_actor(request)
        )
        return _settings_response(cluster, job)
