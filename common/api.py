"""The API's one error shape, `{"error": code, "detail": text, ...extra}`, and the
DRF exception handler that gives it: the one place an application error
(`common.errors`) becomes an HTTP status."""

from __future__ import annotations

from django.http import JsonResponse
from rest_framework import status
from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.response import Response
from rest_framework.views import exception_handler

from common import errors

# Each error class's status; a subclass takes its nearest listed ancestor's.
STATUS_OF = {
    errors.Invalid: 400,
    errors.PermissionDenied: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.TooLarge: 413,
    errors.Unavailable: 503,
    errors.AppError: 400,
}


def status_of(exc: errors.AppError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return 400


def error_body(code: str, detail: str, **extra) -> dict:
    return {"error": code, "detail": detail, **extra}


def api_error(status_code: int, code: str, detail: str, **extra) -> JsonResponse:
    """An error answered outside DRF (a middleware, Django's handlers)."""
    return JsonResponse(error_body(code, detail, **extra), status=status_code)


def api_exception_handler(exc, context):
    if isinstance(exc, errors.AppError):
        return Response(error_body(exc.code, exc.detail, **exc.extra), status=status_of(exc))
    response = exception_handler(exc, context)
    if response is None:
        return None  # not DRF's: console.exceptions.ErrorAnswers answers it
    data = response.data
    code = getattr(exc, "default_code", "error")
    if isinstance(data, dict) and set(data) == {"detail"}:
        code = getattr(data["detail"], "code", code)  # Http404 arrives as DRF's NotFound
        response.data = error_body(code, str(data["detail"]))
    elif response.status_code == status.HTTP_400_BAD_REQUEST:
        response.data = error_body("invalid", "The request is invalid.", fields=data)
    return response


class FormatNegotiation(DefaultContentNegotiation):
    """`?format=` the endpoint does not serve (the browsable API's `api`) is a 406
    naming the formats it does, not DRF's 404 for an endpoint that exists."""

    def filter_renderers(self, renderers, format):
        found = [r for r in renderers if r.format == format]
        if not found:
            formats = ", ".join(sorted({r.format for r in renderers}))
            raise NotAcceptable(f"format must be one of: {formats}.")
        return found
