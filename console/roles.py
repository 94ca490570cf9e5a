"""Roles shared by API tokens and browser users.

viewer < operator < admin; `ingest` stands apart: it may post events for its
cluster and nothing else. A Django user's role is the highest of the groups
named after roles it belongs to (a superuser is an admin). A token that acts as a
user may do no more than that user may now: a demoted user's tokens are demoted
with them, and a user left with no role has tokens that may do nothing.
"""

ROLE_ORDER = ("viewer", "operator", "admin")
INGEST = "ingest"


def user_role(user) -> str | None:
    """The role of a Django user, or of a token without a user (its scope)."""
    if not user or not user.is_authenticated or not user.is_active:
        return None
    from console.auth import TokenPrincipal

    if isinstance(user, TokenPrincipal):  # it has no groups
        return user.token.scope
    if user.is_superuser:
        return "admin"
    # Kept on the user object: a page asks several times per request (one query).
    cached = getattr(user, "_rebound_role", False)
    if cached is not False:
        return cached
    names = {g.name for g in user.groups.all()}
    role = next((r for r in reversed(ROLE_ORDER) if r in names), None)
    user._rebound_role = role
    return role


def role_allows(role: str | None, required: str) -> bool:
    """Whether `role` may do what needs `required`."""
    if role is None:
        return False
    if required == INGEST or role == INGEST:
        return role == required
    return ROLE_ORDER.index(role) >= ROLE_ORDER.index(required)


def lower_role(a: str, b: str) -> str:
    return min(a, b, key=ROLE_ORDER.index)


def token_role(token) -> str | None:
    """What a token may do: its scope, bounded by its user's current role when it has one."""
    if token.user_id is None:
        return token.scope
    held = user_role(token.user)
    if held is None:
        return None
    if token.scope == INGEST:
        return INGEST
    return lower_role(token.scope, held)


def request_role(request) -> str | None:
    """The role a request acts with: its token's (see token_role), else its user's role."""
    from console.models import ApiToken

    if isinstance(getattr(request, "auth", None), ApiToken):
        return token_role(request.auth)
    return user_role(request.user)
