"""Imported by a worker a test starts (worker_settings_flaky): the noop driver's first
call in that worker raises a transient error, as a busy scheduler would; later
calls succeed."""

from recovery.drivers import DriverTransientError
from recovery.drivers.noop import NoopDriver

NoopDriver.errors.append(DriverTransientError("scheduler busy (once)"))
