"""A Redis cache that fails soft: the cache only saves work, so with Redis away a
read misses and a write is skipped (logged once a minute), never a 500 and never a
failed task. Counters (`incr`) and `add`, whose callers rely on their answer, still
raise."""

import logging
import time

from django.core.cache.backends.redis import RedisCache
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

_WARN_EVERY_S = 60.0


class FailSoftRedisCache(RedisCache):
    _warned_at = 0.0

    def _away(self, what: str, exc: Exception) -> None:
        now = time.monotonic()
        if now - FailSoftRedisCache._warned_at >= _WARN_EVERY_S:
            FailSoftRedisCache._warned_at = now
            logger.warning("cache unavailable (%s skipped): %s", what, exc)

    def get(self, key, default=None, version=None):
        try:
            return super().get(key, default, version)
        except RedisError as exc:
            self._away("get", exc)
            return default

    def get_many(self, keys, version=None):
        try:
            return super().get_many(keys, version)
        except RedisError as exc:
            self._away("get_many", exc)
            return {}

    def set(self, key, value, timeout=None, version=None):
        try:
            super().set(key, value, timeout, version)
        except RedisError as exc:
            self._away("set", exc)

    def set_many(self, data, timeout=None, version=None):
        try:
            return super().set_many(data, timeout, version)
        except RedisError as exc:
            self._away("set_many", exc)
            return list(data)

    def delete(self, key, version=None):
        try:
            return super().delete(key, version)
        except RedisError as exc:
            self._away("delete", exc)
            return False
