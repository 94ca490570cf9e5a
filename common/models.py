"""The outbox: Celery work asked for inside a transaction, kept in the database until
the broker has taken it (see common.outbox)."""

from django.db import models


class OutboxEntry(models.Model):
    """One task to send, at most one per (task, key): a second request for the same
    work merges into the first (the earlier due time wins, with its arguments)."""

    task = models.CharField(max_length=100, help_text="the registered Celery task name")
    key = models.CharField(max_length=100, help_text="what the work is about, e.g. a job id")
    args = models.JSONField(default=list)
    due_at = models.DateTimeField(help_text="not to run before (a debounce)")
    retry_at = models.DateTimeField(
        help_text="when the drain sends it again if it is still here: a send failed, "
        "or the broker lost the message"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "key"], name="outbox_one_per_task_key")
        ]
        indexes = [models.Index(fields=["retry_at"], name="outbox_retry_at")]
        verbose_name_plural = "outbox entries"

    def __str__(self):
        return f"{self.task}({self.key}) due {self.due_at:%H:%M:%S}"
