"""The cache only saves work: with Redis away, pages that read it still answer."""

import pytest

from tests.console.test_job_page import ingest_job
from tests.processes import free_port

pytestmark = pytest.mark.django_db


def _cache_at_a_closed_port(settings, backend):
    settings.CACHES = {
        "default": {
            "BACKEND": backend,
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }


def test_pages_answer_while_the_cache_is_away(settings, client, personas):
    ingest_job("cacheless", launches=2, steps_per_launch=40)
    _cache_at_a_closed_port(settings, "common.cache.FailSoftRedisCache")
    client.force_login(personas["viewer"].user)
    for url in ("/", "/jobs/cacheless/", "/api/v1/jobs/cacheless/goodput"):
        assert client.get(url).status_code == 200, url


def test_the_plain_redis_cache_would_fail_those_pages(settings, client, personas):
    """What the fail-soft backend is for (and a check that the port above is closed)."""
    from redis.exceptions import ConnectionError

    ingest_job("cacheless", launches=2, steps_per_launch=40)
    _cache_at_a_closed_port(settings, "django.core.cache.backends.redis.RedisCache")
    client.force_login(personas["viewer"].user)
    with pytest.raises(ConnectionError):
        client.get("/jobs/cacheless/")
