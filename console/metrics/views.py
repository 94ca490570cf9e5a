"""GET /metrics: Prometheus's text format, for a scraper holding a bearer token (any
API token, or REBOUND_METRICS_TOKEN), a signed-in console user with a role, or a
client at an address in REBOUND_METRICS_ALLOW_FROM. Anyone else gets 401 (no or
unknown credentials) or 403 (credentials that may do nothing), in the API's error
shape."""

from __future__ import annotations

import hmac
import ipaddress

from django.conf import settings
from django.http import HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from rest_framework import exceptions

from common.api import api_error
from console.auth import BearerTokenAuthentication
from console.metrics.collector import ReboundCollector
from console.roles import token_role, user_role
from console.signin import client_address

AUTHENTICATE = 'Bearer realm="metrics"'


def _allowed_address(request) -> bool:
    networks = settings.REBOUND_METRICS_ALLOW_FROM
    if not networks:
        return False
    try:
        address = ipaddress.ip_address(client_address(request).split("%")[0])
    except ValueError:
        return False
    return any(address in network for network in networks)


def _refused(status: int, code: str, detail: str) -> HttpResponse:
    response = api_error(status, code, detail)
    if status == 401:
        response["WWW-Authenticate"] = AUTHENTICATE
    return response


def _check(request) -> HttpResponse | None:
    """None when the request may read the metrics, else the refusal."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if header:
        dedicated = settings.REBOUND_METRICS_TOKEN
        scheme, _, raw = header.partition(" ")
        if (
            dedicated
            and scheme.lower() == "bearer"
            and hmac.compare_digest(raw.strip().encode(), dedicated.encode())
        ):
            return None
        try:
            found = BearerTokenAuthentication().authenticate(request)
        except exceptions.AuthenticationFailed as exc:
            return _refused(401, "authentication_failed", str(exc.detail))
        if found is None:
            return _refused(401, "not_authenticated", "Authorization must be 'Bearer <token>'.")
        if token_role(found[1]) is None:
            return _refused(403, "permission_denied", "This token may do nothing now.")
        return None
    if _allowed_address(request):
        return None
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        if user_role(user) is None:
            return _refused(403, "permission_denied", "A user without a role may not do this.")
        return None
    return _refused(
        401,
        "not_authenticated",
        "Send 'Authorization: Bearer <token>' (an API token or REBOUND_METRICS_TOKEN),"
        " or scrape from an address in REBOUND_METRICS_ALLOW_FROM.",
    )


def metrics(request):
    if request.method not in ("GET", "HEAD"):
        response = api_error(405, "method_not_allowed", f"{request.method[:20]} is not allowed.")
        response["Allow"] = "GET, HEAD"
        return response
    refused = _check(request)
    if refused is not None:
        return refused
    registry = CollectorRegistry(auto_describe=False)  # the library's global one stays empty
    registry.register(ReboundCollector())
    # The classic text format (0.0.4), which every Prometheus 2.x reads; the names are
    # all plain, so the library's output is the same in either version.
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_PLAIN_0_0_4)
