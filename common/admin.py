from django.contrib import admin

from common.models import OutboxEntry


@admin.register(OutboxEntry)
class OutboxEntryAdmin(admin.ModelAdmin):
    list_display = ("task", "key", "due_at", "retry_at", "created_at")
    search_fields = ("task", "key")
