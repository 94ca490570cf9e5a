"""Ingest requests the server refused, counted by reason in the cache (Redis when
REDIS_URL is set), for `rebound_ingest_refused_requests_total`.

Every refusal of POST /api/v1/ingest, whoever answered it (the view, DRF's
authentication, a middleware, the database-away answer), leaves with the API's error
shape `{"error": code, ...}`; `IngestRefusals` (a middleware) reads that code on the
way out and adds one to its counter. No table: a counter in the cache, shared by every
web process, that restarts from 0 when the cache is emptied (a Redis restart without
persistence), which Prometheus reads as a counter reset.
"""

from __future__ import annotations

import json
import logging

from django.core.cache import cache, caches
from django.urls import reverse

from common.cache import FailSoftRedisCache

logger = logging.getLogger(__name__)

KEY_PREFIX = "rebound:metrics:ingest_refused:"
# The codes an ingest refusal may carry; any other is counted as "other", so that the
# reasons (and the keys read at each scrape) stay a fixed, small set.
REASONS = (
    "invalid_body",
    "invalid_events",
    "invalid_parameter",
    "too_large",
    "too_many_events",
    "unsupported_encoding",
    "unsupported_media_type",
    "history_conflict",
    "forbidden_job",
    "not_authenticated",
    "authentication_failed",
    "permission_denied",
    "method_not_allowed",
    "throttled",
    "unavailable",
    "server_error",
    "other",
)


def reason_of(body: bytes) -> str:
    """The error code of an API error body, or "other"."""
    try:
        code = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return "other"
    return code if code in REASONS else "other"


def refusal_count(reason: str) -> None:
    """Add one refusal of `reason`. Never fails the request: a cache that is away
    loses the count (logged)."""
    key = KEY_PREFIX + (reason if reason in REASONS else "other")
    try:
        cache.add(key, 0, timeout=None)  # incr needs the key; add never overwrites
        cache.incr(key)
    except Exception as exc:  # Redis away, or the key evicted between add and incr
        logger.warning("ingest refusal of %s not counted: %s", reason, exc)


def counts() -> dict[str, int]:
    """Each reason's count so far (0 when never counted). Raises when the cache does
    not answer, so that the scrape leaves the counter out rather than report zeros,
    which Prometheus would take for a reset."""
    keys = [KEY_PREFIX + r for r in REASONS]
    backend = caches["default"]
    if isinstance(backend, FailSoftRedisCache):
        # The fail-soft cache answers {} when Redis is away; ask past it.
        stored = super(FailSoftRedisCache, backend).get_many(keys)
    else:
        stored = backend.get_many(keys)
    return {r: int(stored.get(KEY_PREFIX + r) or 0) for r in REASONS}


class IngestRefusals:
    """Counts each refused POST to the ingest endpoint by its error code. Placed
    outside console.exceptions.ErrorAnswers, so it sees the answers that middleware
    gives (reshaped errors, the database away) too."""

    def __init__(self, get_response):
        self.get_response = get_response
        self.path = None

    def __call__(self, request):
        response = self.get_response(request)
        if response.status_code >= 400 and request.method == "POST":
            if self.path is None:
                self.path = reverse("ingest")
            if request.path_info == self.path:
                refusal_count(reason_of(getattr(response, "content", b"")))
        return response
