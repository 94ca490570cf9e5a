"""API tokens. The token itself is shown once, at issue; only its SHA-256 is kept."""

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "rbd_"


def token_digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def new_raw_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class ApiToken(models.Model):
    class Scope(models.TextChoices):
        INGEST = "ingest"  # bound to one cluster: create jobs there and post events
        VIEWER = "viewer"
        OPERATOR = "operator"
        ADMIN = "admin"

    name = models.CharField(max_length=100, blank=True)
    digest = models.CharField(max_length=64, unique=True)
    hint = models.CharField(
        max_length=12, help_text="the token's first characters, to tell tokens apart"
    )
    scope = models.CharField(max_length=16, choices=Scope.choices)
    cluster = models.ForeignKey(
        "jobs.Cluster", on_delete=models.CASCADE, null=True, blank=True, related_name="tokens"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="api_tokens",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(scope="ingest", cluster__isnull=False) | ~models.Q(scope="ingest")
                ),
                name="ingest_token_has_cluster",
            )
        ]

    def __str__(self):
        return f"{self.hint}… ({self.scope})"


class LoginFailure(models.Model):
    """A failed sign-in, kept a while to throttle guessing (console.signin). In the
    database, so every web worker counts the same failures."""

    username = models.CharField(max_length=150)
    address = models.CharField(max_length=64, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["username", "at"], name="login_failure_username_at"),
            models.Index(fields=["address", "at"], name="login_failure_address_at"),
            models.Index(fields=["at"], name="login_failure_at"),
        ]

    def __str__(self):
        return f"{self.username} from {self.address or '?'} at {self.at:%Y-%m-%d %H:%M:%S}"
