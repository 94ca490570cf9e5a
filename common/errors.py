"""The one error hierarchy services raise. An error names what went wrong (`code`,
a stable snake_case word clients branch on) and says it (`detail`); `extra` holds
any further fields of the answer. It carries no HTTP status: the API's handler
(`common.api`) maps each class to one, and pages show `detail`.

Raise the narrowest class: `Invalid` for a request that can never succeed as
written, `Conflict` for one the current state refuses (it may succeed later or
after something else changes), `NotFound` for a named thing that does not exist.
"""

from __future__ import annotations


class AppError(Exception):
    """An application error: `code` names it, `detail` says it, `extra` adds fields."""

    code = "error"

    def __init__(self, detail: str, *, code: str | None = None, **extra):
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        self.extra = extra


class Invalid(AppError):
    """The request is malformed or names values that can never be accepted."""

    code = "invalid"


class NotFound(AppError):
    """A thing the request names does not exist."""

    code = "not_found"


class PermissionDenied(AppError):
    """The caller may not do this."""

    code = "permission_denied"


class Conflict(AppError):
    """The current state refuses the request (a guardrail, a lease, a stale view)."""

    code = "conflict"


class Unavailable(AppError):
    """Something the request needs is away for now; the caller may retry."""

    code = "unavailable"


class TooLarge(AppError):
    """The request is bigger than the server takes."""

    code = "too_large"
