"""Settings of a worker process a test starts (DJANGO_SETTINGS_MODULE): the project's
own, with one more module imported at the worker's start (Celery's `imports`) that
makes the noop driver's first call in that process fail with a transient error."""

from console.settings import *  # noqa: F403

CELERY_IMPORTS = ("tests.recovery.flaky_noop",)
