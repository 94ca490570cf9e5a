"""One permission class for the API: each view names the role it needs."""

from rest_framework import permissions

from console.roles import request_role, role_allows


class HasRequiredRole(permissions.BasePermission):
    """Views set `required_role` (or `required_roles` per HTTP method).

    Safe methods default to `viewer`, others to `operator`.
    """

    message = "Your role may not do this."

    def has_permission(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return False
        required = getattr(view, "required_roles", {}).get(request.method) or getattr(
            view, "required_role", None
        )
        if required is None:
            required = "viewer" if request.method in permissions.SAFE_METHODS else "operator"
        role = request_role(request)
        if not role_allows(role, required):
            self.message = (
                f"A {role or 'user without a role'} may not do this; it needs {required}."
            )
            return False
        return True
