"""The jobs API: ingest (wire format v1) and the read API."""

import zlib

from django.conf import settings
from django.http import RawPostDataException
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from console.exceptions import ApiError
from jobs import selectors, services
from jobs.api import serializers as s
from jobs.api.params import choice_param, time_param
from jobs.models import TrainingJob
from jobs.wire import WireError, parse_body, validate_events


def _read_body(request) -> bytes:
    """The request body, decompressed when gzip-encoded; 413 past the size limit."""
    limit = settings.INGEST_MAX_BYTES
    too_big = ApiError(
        413, "too_large", f"A request may carry at most {limit} bytes ({limit // 1048576} MiB)."
    )
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        raise too_big
    try:
        body = request.body
    except RawPostDataException:  # pragma: no cover - body already consumed
        raise ApiError(400, "invalid_body", "The request body could not be read.") from None
    except Exception as exc:  # RequestDataTooBig
        raise too_big from exc
    if len(body) > limit:
        raise too_big
    if request.META.get("HTTP_CONTENT_ENCODING", "").lower() == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            body = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            raise ApiError(400, "invalid_body", f"The gzip body is corrupt: {exc}") from exc
        if len(body) > limit or inflater.unconsumed_tail:
            raise too_big
    return body


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
                " started with another id, a new launch of a finished job); nothing stored"
            ),
            413: OpenApiResponse(description="more than 5,000 events or 5 MiB"),
            415: OpenApiResponse(description="a Content-Encoding other than gzip"),
        },
    )
    def post(self, request):
        body = _read_body(request)
        try:
            raw = parse_body(body)
            if len(raw) > settings.INGEST_MAX_EVENTS:
                raise ApiError(
                    413,
                    "too_many_events",
                    f"{len(raw)} events; a request may carry at most {settings.INGEST_MAX_EVENTS}.",
                )
            events, errors = validate_events(raw, settings.INGEST_MAX_EVENTS)
        except WireError as exc:
            raise ApiError(
                400,
                "invalid_body",
                f"{exc.field}: {exc.reason}",
                errors=[{"index": None, "field": exc.field, "reason": exc.reason}],
            ) from exc
        if errors:
            bad = len({e["index"] for e in errors})
            raise ApiError(
                400,
                "invalid_events",
                f"{bad} of {len(raw)} events are invalid; nothing was stored.",
                errors=errors,
            )
        try:
            result = services.events_ingest(cluster=request.auth.cluster, events=events)
        except services.JobsOfAnotherCluster as exc:
            raise ApiError(
                403,
                "forbidden_job",
                f"This token's cluster '{exc.cluster}' does not own job(s): {', '.join(exc.keys)}.",
                jobs=exc.keys,
            ) from exc
        return Response(
            {"accepted": result.accepted, "duplicates": result.duplicates},
            status=status.HTTP_202_ACCEPTED,
        )


class JobViewMixin:
    def get_serializer_context(self):
        context = super().get_serializer_context()
        many = isinstance(self, generics.ListAPIView)
        context["goodput"] = lambda job: selectors.job_goodput(job=job, allow_stale=many)
        return context


@extend_schema(
    parameters=[
        OpenApiParameter("cluster", str, description="only this cluster's jobs"),
        OpenApiParameter("status", str, enum=TrainingJob.Status.values),
    ]
)
class JobListView(JobViewMixin, generics.ListAPIView):
    serializer_class = s.JobSerializer

    def get_queryset(self):
        params = self.request.query_params
        status_ = choice_param(self.request, "status", TrainingJob.Status.values)
        return selectors.job_list(cluster=params.get("cluster"), status=status_)

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
            OpenApiParameter(
                "start", OpenApiTypes.STR, description="window start (RFC 3339 or unix s)"
            ),
            OpenApiParameter(
                "end", OpenApiTypes.STR, description="window end (RFC 3339 or unix s)"
            ),
        ],
        responses=s.GoodputSerializer,
    )
    def get(self, request, key):
        start, end = time_param(request, "start"), time_param(request, "end")
        if start is not None and end is not None and end < start:
            raise ApiError(400, "invalid_parameter", "end must not be before start.", field="end")
        job = _job(key)
        if start is None and end is None:
            job = TrainingJob.objects.select_related("ledger").get(pk=job.pk)
        return Response(selectors.job_goodput(job=job, start=start, end=end))


class JobAttemptsView(generics.ListAPIView):
    serializer_class = s.AttemptSerializer

    def get_queryset(self):
        return selectors.job_attempts(job=_job(self.kwargs["key"]))


class JobCheckpointsView(generics.ListAPIView):
    serializer_class = s.CheckpointSerializer

    def get_queryset(self):
        return selectors.job_checkpoints(job=_job(self.kwargs["key"]))
