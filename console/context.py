"""Template context every page gets: the header's badges."""


def badges(request):
    user = getattr(request, "user", None)
    if not user or not user.is_authenticated or request.path.startswith("/admin/"):
        return {}
    from console.pages.live import badges as counts
    from console.roles import request_role

    # request_role: a page rendered for an API token (Swagger UI) acts with its scope.
    return {"badges": counts(), "role": request_role(request)}
