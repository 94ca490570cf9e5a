"""The jobs API: ingest (wire format v1) and the read API."""

import zlib

from django.conf import settings
from django.http import RawPostDataException
from django.shortcuts import get_object_or_404
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
    """The request body, decompressed when gzip-encoded; 413 past the size limit.

    A chunked body (Transfer-Encoding: chunked, no Content-Length) is read from the
    WSGI stream, which the server de-chunks: Django alone would read it as empty.
    """
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
    chunked = "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
    try:
        if chunked and not request.META.get("CONTENT_LENGTH"):
            body = _read_stream(request.META["wsgi.input"], limit)
        else:
            body = request.body
    except RawPostDataException:  # pragma: no cover - body already consumed
        raise ApiError(400, "invalid_body", "The request body could not be read.") from None
    except OSError as exc:  # the client went away mid-body
        raise ApiError(400, "invalid_body", f"The request body could not be read: {exc}") from exc
    except Exception as exc:  # RequestDataTooBig
        raise too_big from exc
    if len(body) > limit:
        raise too_big
    encoding = request.META.get("HTTP_CONTENT_ENCODING", "").strip().lower()
    if encoding == "gzip":
        body = _gunzip(body, limit, too_big)
    elif encoding not in ("", "identity"):
        raise ApiError(
            415,
            "unsupported_encoding",
            f"Content-Encoding {encoding[:40]!r} is not supported; send gzip or no encoding.",
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


def _gunzip(body: bytes, limit: int, too_big: ApiError) -> bytes:
    """Every member of a gzip body (RFC 1952 allows several, concatenated), at most
    `limit` bytes once inflated; a truncated member or trailing bytes are a 400."""
    out, size, rest = [], 0, body
    while rest:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            part = inflater.decompress(rest, limit + 1 - size)
        except zlib.error as exc:
            what = "trailing data after the last gzip member" if out else "the gzip body is corrupt"
            raise ApiError(400, "invalid_body", f"{what}: {exc}") from exc
        size += len(part)
        if size > limit:
            raise too_big
        if not inflater.eof:
            raise ApiError(400, "invalid_body", "The gzip body is truncated.")
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
        except services.HistoryConflict as exc:
            first = exc.conflicts[0]
            more = len(exc.conflicts) - 1
            detail = first["reason"] + (f"; and {more} more" if more else "")
            if "finished_at" in first["stored"]:
                detail += f" (POST /api/v1/jobs/{first['job']}/reopen)"
            raise ApiError(
                409,
                "history_conflict",
                detail + ". Nothing of this request was stored.",
                conflicts=exc.conflicts,
            ) from exc
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
        try:
            services.job_reopen(job=job, actor=actor, reason=form.validated_data.get("reason", ""))
        except services.JobNotFinished as exc:
            raise ApiError(409, "not_finished", f"{exc}.", job=exc.job) from exc
        job = selectors.job_list().get(pk=job.pk)
        selectors.attach_summaries([job])
        context = {"goodput": lambda j: selectors.job_goodput(job=j)}
        return Response(s.JobSerializer(job, context=context).data)


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
            OpenApiParameter("start", s.TIME_SCHEMA, description="window start"),
            OpenApiParameter("end", s.TIME_SCHEMA, description="window end"),
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
