from django.contrib import admin

from console.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are issued with `manage.py issue_token`; here they can be seen and revoked."""

    list_display = [
        "hint",
        "name",
        "scope",
        "cluster",
        "user",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["scope", "cluster"]
    readonly_fields = ["digest", "hint", "scope", "cluster", "user", "created_at", "last_used_at"]
    fields = ["name", *readonly_fields, "revoked_at"]

    def has_add_permission(self, request):
        return False
