"""Bearer-token authentication for the API."""

from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions

from console.models import ApiToken, token_digest

# Writing last_used_at on every request would cost a write per ingest batch.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class TokenPrincipal:
    """Who a token without a user acts as."""

    is_authenticated = True
    is_active = True
    is_superuser = False
    is_staff = False
    pk = None

    def __init__(self, token: ApiToken):
        self.token = token
        self.username = f"token:{token.name or token.hint}"

    def __str__(self):
        return self.username


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'.")
        try:
            raw = header[1].decode()
        except UnicodeError as exc:
            raise exceptions.AuthenticationFailed("Token contains invalid characters.") from exc
        token = (
            ApiToken.objects.select_related("user", "cluster")
            .filter(digest=token_digest(raw), revoked_at__isnull=True)
            .first()
        )
        if token is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked token.")
        if token.user is not None and not token.user.is_active:
            raise exceptions.AuthenticationFailed("The token's user is inactive.")
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return (token.user or TokenPrincipal(token), token)

    def authenticate_header(self, request):
        return f'{self.keyword} realm="api"'
