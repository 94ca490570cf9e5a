"""The jobs API: ingest (wire format v1) and the read API."""

import zlib
from functools import cached_property

from django.conf import settings
from django.http import RawPostDataException
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import UnsupportedMediaType
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from common.errors import Invalid, NotFound, TooLarge
from common.params import InvalidParameter, choice_param, time_param
from jobs import selectors, services
from jobs.api import serializers as s
from jobs.models import Cluster, TrainingJob
from jobs.wire import parse_body, validate_events


def _read_body(request) -> bytes:
    """The request body, decompressed when gzip-encoded; 413 past the size limit.

    A chunked body (Transfer-Encoding: chunked, no Content-Length) is read from the
    WSGI stream, which the server de-chunks: Django alone would read it as empty.
    """
    limit = settings.INGEST_MAX_BYTES
    too_big = TooLarge(f"A request may carry at most {limit} bytes ({limit // 1048576} MiB).")
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        raise too_big
    chunked = "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
    try:
        if chunked and not request.META.get("CONTENT_LENGTH"):
            body = _read_stream(request.META["wsgi.input"], limit)
        else:
            body = request.body
    except RawPostDataException:  # pragma: no cover - body already consumed
        raise Invalid("The request body could not be read.", code="invalid_body") from None
    except OSError as exc:  # the client went away mid-body
        raise Invalid(f"The request body could not be read: {exc}", code="invalid_body") from exc
    except Exception as exc:  # RequestDataTooBig
        raise too_big from exc
    if len(body) > limit:
        raise too_big
    encoding = request.META.get("HTTP_CONTENT_ENCODING", "").strip().lower()
    if encoding == "gzip":
        body = _gunzip(body, limit, too_big)
    elif encoding not in ("", "identity"):
        # 415 is HTTP's own answer about the request's encoding, DRF's to give.
        raise UnsupportedMediaType(
            encoding,
            detail=f"Content-Encoding {encoding[:40]!r} is not supported;"
            " send gzip or no encoding.",
            code="unsupported_encoding",
        )
    return body


def _read_stream(stream, limit: int) -> bytes:
    """Up to limit + 1 bytes of a stream of unknown length: one past is enough to refuse."""
    parts, size = [], 0
    while size <= limit:
        part = stream.read(min(65536, limit + 1 - size))
        if not part:
            break
        parts.append(part)
        size += len(part)
    return b"".join(parts)


def _gunzip(body: bytes, limit: int, too_big: TooLarge) -> bytes:
    """Every member of a gzip body (RFC 1952 allows several, concatenated), at most
    `limit` bytes once inflated; a truncated member or trailing bytes are a 400."""
    out, size, rest = [], 0, body
    while rest:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            part = inflater.decompress(rest, limit + 1 - size)
        except zlib.error as exc:
            what = "trailing data after the last gzip member" if out else "the gzip body is corrupt"
            raise Invalid(f"{what}: {exc}", code="invalid_body") from exc
        size += len(part)
        if size > limit:
            raise too_big
        if not inflater.eof:
            raise Invalid("The gzip body is truncated.", code="invalid_body")
        out.append(part)
        rest = inflater.unused_data
    return b"".join(out)


class IngestView(APIView):
    """Post a batch of wire-format v1 events: all or nothing, idempotent on (job, id)."""

    required_role = "ingest"

    @extend_schema(
        # The raw body is read (JSON, optionally `Content-Encoding: gzip`), never a form.
        request={"application/json": s.IngestRequestSerializer},
        responses={
            202: s.IngestResponseSerializer,
            400: OpenApiResponse(
                description="invalid body or events: each bad event's index, field and"
                " reason in `errors`; nothing was stored"
            ),
            403: OpenApiResponse(
                description="the token may not ingest, or its cluster does not own a job"
            ),
            409: OpenApiResponse(
                description="the batch would rewrite a launch's history (a launch number"
                " started with another id, a new launch of a finished job); nothing stored."
                " `conflicts` lists each: index, job, attempt (the launch), reason, and"
                " `stored` (the launch's start: event, started_at; or the job's finished_at)"
            ),
            413: OpenApiResponse(description="more than 5,000 events or 5 MiB"),
            415: OpenApiResponse(description="a Content-Encoding other than gzip"),
        },
    )
    def post(self, request):
        body = _read_body(request)
        raw = parse_body(body)  # WireError: a 400 naming the field
        if len(raw) > settings.INGEST_MAX_EVENTS:
            raise TooLarge(
                f"{len(raw)} events; a request may carry at most {settings.INGEST_MAX_EVENTS}.",
                code="too_many_events",
            )
        events, errors = validate_events(raw, settings.INGEST_MAX_EVENTS)
        if errors:
            bad = len({e["index"] for e in errors})
            raise Invalid(
                f"{bad} of {len(raw)} events are invalid; nothing was stored.",
                code="invalid_events",
                errors=errors,
            )
        # JobsOfAnotherCluster (403) and HistoryConflict (409) answer for themselves.
        result = services.events_ingest(cluster=request.auth.cluster, events=events)
        return Response(
            {"accepted": result.accepted, "duplicates": result.duplicates},
            status=status.HTTP_202_ACCEPTED,
        )


class JobReopenView(APIView):
    """An operator reopens a finished job so that it takes new launches again."""

    required_role = "operator"

    @extend_schema(
        request=s.JobReopenSerializer,
        responses={
            200: s.JobSerializer,
            409: OpenApiResponse(description="the job is not finished: nothing to reopen"),
        },
        summary="Reopen a finished job: it takes new launches; its ledger runs on past the finish",
    )
    def post(self, request, key):
        job = _job(key)
        form = s.JobReopenSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        actor = getattr(request.user, "username", "") or str(request.user)
        # JobNotFinished: a 409
        services.job_reopen(job=job, actor=actor, reason=form.validated_data.get("reason", ""))
        job = selectors.job_list().get(pk=job.pk)
        selectors.attach_summaries([job])
        # The ledger changed with the reopening: computed here, stored for the next reader.
        context = {"goodput": lambda j: services.job_goodput(job=j)}
        return Response(s.JobSerializer(job, context=context).data)


class JobViewMixin:
    @cached_property
    def now(self):
        """The one time a request judges silence by: its filter and its answers."""
        return timezone.now()

    def get_serializer_context(self):
        context = super().get_serializer_context()
        context["now"] = self.now
        many = isinstance(self, generics.ListAPIView)
        # Figures computed for a job with no usable snapshot are stored for the next reader.
        context["goodput"] = lambda job: services.job_goodput(job=job, allow_stale=many)
        return context


@extend_schema(
    parameters=[
        OpenApiParameter("cluster", str, description="only this cluster's jobs"),
        OpenApiParameter(
            "status",
            str,
            enum=TrainingJob.Status.values,
            description="the stored status: `running` includes the silent jobs",
        ),
        OpenApiParameter(
            "silent",
            str,
            enum=["true", "false"],
            description="`true`: only the jobs whose `activity` is `silent`; `false`: the others",
        ),
    ]
)
class JobListView(JobViewMixin, generics.ListAPIView):
    serializer_class = s.JobSerializer

    def get_queryset(self):
        params = self.request.query_params
        status_ = choice_param(self.request, "status", TrainingJob.Status.values)
        silent = choice_param(self.request, "silent", ("true", "false"))
        return selectors.job_list(
            cluster=params.get("cluster"),
            status=status_,
            silent=None if silent is None else silent == "true",
            now=self.now,
        )

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        selectors.attach_summaries(page)
        return page


class JobDetailView(JobViewMixin, generics.RetrieveAPIView):
    serializer_class = s.JobSerializer
    lookup_field = "key"

    def get_queryset(self):
        return selectors.job_list()

    def get_object(self):
        job = super().get_object()
        selectors.attach_summaries([job])
        return job


def _job(key: str) -> TrainingJob:
    return get_object_or_404(TrainingJob.objects.select_related("cluster"), key=key)


class JobGoodputView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("start", s.TIME_SCHEMA, description="window start"),
            OpenApiParameter("end", s.TIME_SCHEMA, description="window end"),
        ],
        responses=s.GoodputSerializer,
    )
    def get(self, request, key):
        start, end = time_param(request, "start"), time_param(request, "end")
        if start is not None and end is not None and end < start:
            raise InvalidParameter("end must not be before start.", field="end")
        job = _job(key)
        if start is None and end is None:  # the cumulative figures: the stored snapshot
            job = TrainingJob.objects.select_related("ledger").get(pk=job.pk)
            services.ledger_snapshot_ensure(job=job)
        figures = selectors.job_goodput(job=job, start=start, end=end)
        cost = selectors.job_badput_cost(job=job, gpu_seconds=figures["gpu_seconds"])
        return Response(
            {
                **figures,
                "badput_cost": cost and cost.amount,
                "currency": cost and cost.currency,
            }
        )


class JobAttemptsView(generics.ListAPIView):
    serializer_class = s.AttemptSerializer

    def get_queryset(self):
        return selectors.job_attempts(job=_job(self.kwargs["key"]))


class JobCheckpointsView(generics.ListAPIView):
    serializer_class = s.CheckpointSerializer

    def get_queryset(self):
        return selectors.job_checkpoints(job=_job(self.kwargs["key"]))


class ClusterPricingView(APIView):
    """A cluster's prices per GPU-hour: read by viewers, set by admins."""

    required_roles = {"GET": "viewer", "PUT": "admin"}
    parser_classes = [JSONParser]

    @extend_schema(
        summary="A cluster's price per GPU-hour, currency and node pools' prices",
        responses={200: s.ClusterPricingSerializer, 404: OpenApiResponse(description="no such")},
    )
    def get(self, request, name):
        return _pricing_response(_cluster(name))

    @extend_schema(
        summary="Set a cluster's price per GPU-hour, currency and node pools' prices"
        " (the pools named replace the ones it had)",
        request=s.ClusterPricingSerializer,
        responses={
            200: s.ClusterPricingSerializer,
            400: OpenApiResponse(description="a negative price, a bad currency or pool name"),
            404: OpenApiResponse(description="no such cluster"),
        },
    )
    def put(self, request, name):
        cluster = _cluster(name)
        form = s.ClusterPricingSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        services.cluster_pricing_set(
            cluster=cluster,
            gpu_hour_price=data["gpu_hour_price"],
            currency=data["currency"],
            pools=data["pools"],
            actor=getattr(request.user, "username", "") or str(request.user),
        )
        return _pricing_response(cluster)


def _cluster(name: str) -> Cluster:
    cluster = Cluster.objects.filter(name=name).first()
    if cluster is None:
        raise NotFound(f"No such cluster: {name}.", field="name")
    return cluster


def _pricing_response(cluster: Cluster) -> Response:
    prices = selectors.cluster_prices(cluster)
    return Response(
        s.ClusterPricingSerializer(
            {
                "cluster": cluster.name,
                "gpu_hour_price": prices.price,
                "currency": prices.currency,
                "pools": prices.pools,
            }
        ).data
    )
