"""The Celery app. The broker is Redis when REDIS_URL is set, else an embedded
filesystem broker under var/ (see settings)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("rebound")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
