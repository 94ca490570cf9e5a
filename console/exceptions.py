"""One error shape for the whole API, `{"error": code, "detail": text, ...}`, and the
answers to what no view handles: a request the server cannot read (a NUL in its
query), a database that is away (503 with Retry-After, for the API and the pages),
an unknown API path, and any error under /api/ that would otherwise be a page."""

from __future__ import annotations

import logging
import sys
from http import HTTPStatus

from django.core.signals import got_request_exception
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.urls import Resolver404, resolve
from django.views import defaults

from common.api import api_error

API_PREFIX = "/api/"
# How long a client waits before it retries while the database is away: about
# what a PostgreSQL restart or fail-over takes.
DATABASE_AWAY_RETRY_S = 5
# The codes of answers Django or a middleware gave as a page, by status.
STATUS_CODES = {
    400: "invalid",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "too_large",
    415: "unsupported_media_type",
    429: "throttled",
    500: "server_error",
    503: "unavailable",
}
# Headers an error keeps when it is rewritten in the API's shape.
KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate", "Vary")

logger = logging.getLogger("django.request")


def is_api(request) -> bool:
    return request.path_info.startswith(API_PREFIX)


def database_away(exc: BaseException | None) -> bool:
    """Whether `exc` says the database cannot be reached or dropped the connection
    (a restart, a fail-over, a network cut), rather than that a query is wrong."""
    return isinstance(exc, OperationalError | InterfaceError)


def page_error(status_code: int, title: str, detail: str) -> HttpResponse:
    """A plain page, rendered without the request: no context processor (whose
    header badges query the database) runs."""
    html = render_to_string(
        "console/error.html", {"status": status_code, "title": title, "detail": detail}
    )
    return HttpResponse(html, status=status_code)


def unavailable(request) -> HttpResponse:
    detail = "The database is not reachable; try again in a few seconds."
    if is_api(request):
        response = api_error(503, "unavailable", detail)
    else:
        response = page_error(503, "Service unavailable", detail)
    response["Retry-After"] = str(DATABASE_AWAY_RETRY_S)
    return response


def _nul_parameter(request) -> str | None:
    """The first query parameter, or form field of a page's POST, holding a NUL
    (PostgreSQL stores none: it would fail a write as a 500)."""
    fields = [request.GET]
    if request.method == "POST" and not is_api(request):  # the API reads its own bodies
        fields.append(request.POST)
    for query in fields:
        for name, values in query.lists():
            if "\x00" in name or any("\x00" in v for v in values):
                return name.replace("\x00", "\\x00")
    return None


def _api_not_found(request) -> JsonResponse:
    detail = f"No API endpoint at {request.path_info}."
    if not request.path_info.endswith("/"):
        try:
            resolve(request.path_info + "/")
            detail += f" Did you mean {request.path_info}/ ?"
        except Resolver404:
            pass
    return api_error(404, "not_found", detail)


def _reshaped(response) -> HttpResponse:
    """An error Django or a middleware answered as a page, in the API's shape."""
    try:
        detail = f"{HTTPStatus(response.status_code).phrase}."
    except ValueError:
        detail = f"{response.reason_phrase}."
    code = STATUS_CODES.get(response.status_code, "error")
    if response.status_code == 403 and b"CSRF" in getattr(response, "content", b""):
        detail = "CSRF verification failed."
    out = api_error(response.status_code, code, detail)
    for header in KEPT_HEADERS:
        if header in response:
            out[header] = response[header]
    return out


class ErrorAnswers:
    """Answers the errors no view answers (see the module's docstring). Placed
    before the session, CSRF and authentication middleware, so what they refuse
    under /api/ is reshaped too; it holds in debug mode, where Django's handler404
    and handler500 are not called."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        name = _nul_parameter(request)
        if name is not None:
            detail = f"{name} must not contain a NUL character."
            if is_api(request):
                return api_error(400, "invalid_parameter", detail, field=name)
            return page_error(400, "Bad request", detail)
        if is_api(request):
            try:
                resolve(request.path_info)
            except Resolver404:
                return _api_not_found(request)
        response = self.get_response(request)
        if (
            is_api(request)
            and response.status_code >= 400
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            return _reshaped(response)
        return response

    def process_exception(self, request, exception):
        if database_away(exception):
            logger.warning(
                "Database unavailable: %s %s: %s", request.method, request.path, exception
            )
            return unavailable(request)
        if is_api(request):
            logger.error(
                "Internal Server Error: %s",
                request.path,
                exc_info=exception,
                extra={"status_code": 500, "request": request},
            )
            got_request_exception.send(sender=None, request=request)
            return api_error(500, "server_error", "The server failed; the error is logged.")
        return None


# Django's handlers for what escapes every view and middleware (production mode).


def handler404(request, exception=None):
    if is_api(request):
        return _api_not_found(request)
    return defaults.page_not_found(request, exception)


def handler500(request):
    if database_away(sys.exc_info()[1]):
        return unavailable(request)
    if is_api(request):
        return api_error(500, "server_error", "The server failed; the error is logged.")
    return defaults.server_error(request)
