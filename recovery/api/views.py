"""The recovery API: the action queue (viewers read; operators propose, approve,
reject and cancel), each cluster's pause switch (operators), and the launch gate
(`POST /api/v1/launches`, ingest tokens: a launch's number, or why it must not start)."""

from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import generics, status
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from common.errors import NotFound
from common.params import choice_param, id_param, period_params
from incidents.models import Incident
from incidents.selectors import RELIABILITY_DEFAULT_DAYS, incident_list
from jobs.api.serializers import TIME_SCHEMA
from jobs.models import Cluster, Node, TrainingJob
from recovery import queue, selectors, services
from recovery.api import serializers as s
from recovery.drivers import driver_name
from recovery.faults import fault_inject
from recovery.models import Action
from recovery.policies import policy_table


def _actor(request) -> str:
    return getattr(request.user, "username", "") or str(request.user)


def _user(request):
    """The Django user behind the request, None for a token without one."""
    return request.user if getattr(request.user, "pk", None) else None


def _detail(pk) -> Response:
    action = selectors.action_detail(pk=pk)
    if action is None:
        raise Http404("No such action.")
    evidence = selectors.action_evidence(action)
    return Response(s.ActionDetailSerializer(action, context={"evidence": evidence}).data)


def _action(pk) -> Action:
    action = Action.objects.filter(pk=pk).first()
    if action is None:
        raise Http404("No such action.")
    return action


REFUSALS = {
    400: OpenApiResponse(description="invalid body"),
    403: OpenApiResponse(description="the role may not; own_action: the requester may not"),
    404: OpenApiResponse(description="no such action"),
    409: OpenApiResponse(
        description="invalid_state, conflict (changed meanwhile), guardrail (named in"
        " `guardrail`: expired and moved_on also end the action, its new `state` given),"
        " stale (back in the approval queue)"
    ),
}


class ActionListView(generics.ListCreateAPIView):
    """The action queue, newest first. Operators propose actions; a proposal always
    waits for the approval of another operator."""

    required_roles = {"GET": "viewer", "POST": "operator"}
    serializer_class = s.ActionSerializer
    parser_classes = [JSONParser]

    @extend_schema(
        parameters=[
            OpenApiParameter("state", str, enum=Action.State.values),
            OpenApiParameter("cluster", str),
            OpenApiParameter("job", str),
            OpenApiParameter("node", str),
            OpenApiParameter("kind", str, enum=Action.Kind.values),
            OpenApiParameter(
                "incident",
                {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                description="an id",
            ),
        ]
    )
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        r = self.request
        return selectors.action_list(
            state=choice_param(r, "state", Action.State.values),
            cluster=r.query_params.get("cluster") or None,
            job=r.query_params.get("job") or None,
            node=r.query_params.get("node") or None,
            kind=choice_param(r, "kind", Action.Kind.values),
            incident=id_param(r, "incident"),
        )

    @extend_schema(
        request=s.ActionProposeSerializer,
        responses={201: s.ActionDetailSerializer, **REFUSALS},
        summary="Propose an action (it waits for another operator's approval)",
    )
    def post(self, request, *args, **kwargs):
        form = s.ActionProposeSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        cluster = Cluster.objects.filter(name=data["cluster"]).first()
        if cluster is None:
            raise NotFound(f"No such cluster: {data['cluster']}.", field="cluster")
        node = job = incident = None
        if data.get("node"):
            node = Node.objects.filter(cluster=cluster, name=data["node"]).first()
            if node is None:
                raise NotFound(f"No node {data['node']} in {cluster}.", field="node")
        if data.get("job"):
            job = TrainingJob.objects.filter(key=data["job"]).first()
            if job is None:
                raise NotFound(f"No such job: {data['job']}.", field="job")
        if data.get("incident") is not None:
            incident = Incident.objects.filter(pk=data["incident"]).first()
            if incident is None:
                raise NotFound("No such incident.", field="incident")
        action = services.action_propose(
            cluster=cluster,
            kind=data["kind"],
            node=node,
            job=job,
            params=data.get("params") or {},
            incident=incident,
            reason=data["reason"],
            requested_by=_actor(request),
            requested_by_user=_user(request),
            dry_run=data["dry_run"],
        )
        queue.action_send(action)
        response = _detail(action.pk)
        response.status_code = status.HTTP_201_CREATED
        return response


class ActionDetailView(APIView):
    @extend_schema(responses={200: s.ActionDetailSerializer, 404: REFUSALS[404]})
    def get(self, request, pk):
        """The action with its audit trail and evidence: the incident, the nodes and jobs
        affected, and the GPU-hours at stake."""
        return _detail(pk)


class _DecisionView(APIView):
    """A decision on an action by an operator: the form, the service, what its new state
    calls for sent (recovery.queue), the action back. Each decision names its service
    in `decide(action, request, comment)`, which returns the action as it left it."""

    required_role = "operator"
    parser_classes = [JSONParser]
    form_class = s.DecisionSerializer

    def post(self, request, pk):
        form = self.form_class(data=request.data)
        form.is_valid(raise_exception=True)
        action = self.decide(_action(pk), request, form.validated_data.get("comment", ""))
        queue.action_send(action)
        return _detail(pk)


@extend_schema_view(
    post=extend_schema(
        request=s.DecisionSerializer,
        responses={200: s.ActionDetailSerializer, **REFUSALS},
        summary="Approve (not one's own); the action is queued at once",
    )
)
class ActionApproveView(_DecisionView):
    def decide(self, action, request, comment):
        return services.action_approve(
            action=action, actor=_actor(request), user=_user(request), comment=comment
        )


@extend_schema_view(
    post=extend_schema(
        request=s.RejectSerializer,
        responses={200: s.ActionDetailSerializer, **REFUSALS},
        summary="Reject, saying why",
    )
)
class ActionRejectView(_DecisionView):
    form_class = s.RejectSerializer

    def decide(self, action, request, comment):
        return services.action_reject(
            action=action, actor=_actor(request), user=_user(request), comment=comment
        )


@extend_schema_view(
    post=extend_schema(
        request=s.DecisionSerializer,
        responses={200: s.ActionDetailSerializer, **REFUSALS},
        summary="Cancel an action that has not started running",
    )
)
class ActionCancelView(_DecisionView):
    def decide(self, action, request, comment):
        return services.action_cancel(action=action, actor=_actor(request), comment=comment)


def _cluster(name) -> Cluster:
    cluster = Cluster.objects.filter(name=name).first()
    if cluster is None:
        raise Http404("No such cluster.")
    return cluster


def _recovery_response(cluster: Cluster) -> Response:
    cfg = selectors.cluster_settings(cluster.pk)
    cfg.cluster = cluster
    cfg.driver_in_force = driver_name(cluster)
    table = policy_table(cluster_id=cluster.pk)
    return Response(s.ClusterRecoverySerializer(cfg, context={"policies": table}).data)


class ClusterRecoveryView(APIView):
    @extend_schema(
        responses={200: s.ClusterRecoverySerializer, 404: OpenApiResponse(description="no such")}
    )
    def get(self, request, name):
        """The cluster's recovery settings: driver, pause switch, guardrail limits, and
        the policies in force (the defaults with the cluster's overrides)."""
        return _recovery_response(_cluster(name))


class ClusterPauseView(APIView):
    required_role = "operator"
    parser_classes = [JSONParser]

    @extend_schema(
        request=s.PauseSerializer,
        responses={200: s.ClusterRecoverySerializer, 404: OpenApiResponse(description="no such")},
        summary="Pause recovery: nothing automatic, queued actions held; running ones finish",
    )
    def post(self, request, name):
        cluster = _cluster(name)
        form = s.PauseSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        services.cluster_pause(
            cluster=cluster, actor=_actor(request), reason=form.validated_data["reason"]
        )
        return _recovery_response(cluster)


class ClusterResumeView(APIView):
    required_role = "operator"

    @extend_schema(
        request=None,
        responses={200: s.ClusterRecoverySerializer, 404: OpenApiResponse(description="no such")},
        summary="Resume recovery; the queued actions the pause held are sent again",
    )
    def post(self, request, name):
        cluster = _cluster(name)
        queue.actions_send(services.cluster_resume(cluster=cluster, actor=_actor(request)))
        return _recovery_response(cluster)


class ClusterFaultView(APIView):
    """Fault injection on a lab cluster (the `local` driver): admins only."""

    required_role = "admin"
    parser_classes = [JSONParser]

    @extend_schema(
        request=s.FaultSerializer,
        responses={
            200: OpenApiResponse(OpenApiTypes.OBJECT, description="what was done"),
            400: OpenApiResponse(description="an unknown fault, or one missing what it needs"),
            404: OpenApiResponse(description="no such cluster"),
            409: OpenApiResponse(description="the driver cannot, or the target is not running"),
        },
        summary="Inject a fault: crash, hang, resume, slow, nan, spike, clear, xid, silence, ...",
    )
    def post(self, request, name):
        cluster = _cluster(name)
        form = s.FaultSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        done = fault_inject(cluster=cluster, actor=_actor(request), **form.validated_data)
        return Response(done)


class LaunchView(APIView):
    """A launch asks for its number at start (ingest tokens, for their cluster's jobs).

    Body `{"job": KEY, "launch": IDENTITY}`; answer `{"job", "attempt", "launch",
    "created"}`: 201 with a new number (max of the job's launches and reservations + 1),
    200 when the identity had its number already. The gate (recovery.services.launches)
    refuses a new launch with 409 and a `detail` that says what to do: `job_finished`,
    `cluster_paused`, `crash_loop`; a refusal reserves nothing."""

    required_role = "ingest"
    parser_classes = [JSONParser]

    @extend_schema(
        request=s.LaunchRequestSerializer,
        responses={
            200: s.LaunchReservedSerializer,
            201: s.LaunchReservedSerializer,
            400: OpenApiResponse(description="invalid body: `fields` names each bad field"),
            403: OpenApiResponse(
                description="the token may not ingest, or its cluster does not own the job"
                " (forbidden_job)"
            ),
            409: OpenApiResponse(
                description="the gate refuses a new launch, nothing reserved; `error` is"
                " job_finished (with `finished_at`: reopen the job or use another name),"
                " cluster_paused (`paused_by`, `paused_at`, `reason`) or crash_loop"
                " (`incident`); `job` names the job"
            ),
        },
        summary="Reserve the launch number of a launch identity (idempotent), or refuse it",
    )
    def post(self, request):
        form = s.LaunchRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        # JobsOfAnotherCluster (403) and LaunchRefused (409) answer for themselves.
        got = services.launch_admit(
            cluster=request.auth.cluster, job_key=data["job"], identity=data["launch"]
        )
        body = {"job": got.job.key, "attempt": got.attempt, "launch": got.identity}
        return Response(
            {**body, "created": got.created},
            status=status.HTTP_201_CREATED if got.created else status.HTTP_200_OK,
        )


class IncidentPhasesView(APIView):
    @extend_schema(
        responses={200: s.IncidentPhasesSerializer, 404: OpenApiResponse(description="no such")}
    )
    def get(self, request, pk):
        """Where the incident's time to recover went: detecting, waiting for approval,
        queued, acting, until the next launch, restarting, catching up; people or
        machines (recovery.selectors.phases)."""
        incident = Incident.objects.filter(pk=pk).first()
        if incident is None:
            raise Http404("No such incident.")
        return Response(
            s.IncidentPhasesSerializer(
                {"incident": incident.pk, **selectors.incident_phases(incident)}
            ).data
        )


class PhasesSummaryView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("cluster", str),
            OpenApiParameter("start", TIME_SCHEMA, description="default: 30 days before end"),
            OpenApiParameter("end", TIME_SCHEMA, description="default: now"),
        ],
        responses=s.PhasesSummarySerializer,
    )
    def get(self, request):
        """The mean of each recovery phase over the incidents with a fault in the period,
        and the share of that time spent waiting for people."""
        start, end = period_params(request, default_days=RELIABILITY_DEFAULT_DAYS)
        cluster = request.query_params.get("cluster") or None
        incidents = list(
            incident_list(cluster=cluster, since=start, until=end).prefetch_related(None)
        )
        summary = selectors.phases_summary(incidents)
        return Response(
            s.PhasesSummarySerializer(
                {"cluster": cluster, "start": start, "end": end, **summary}
            ).data
        )
