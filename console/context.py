"""Template context every page gets: the header's badges."""


def badges(request):
    user = getattr(request, "user", None)
    if not user or not user.is_authenticated or request.path.startswith("/admin/"):
        return {}
    from console.pages.live import badges as counts
    from console.roles import user_role

    return {"badges": counts(), "role": user_role(user)}
