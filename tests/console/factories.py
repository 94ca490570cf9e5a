"""Moved to tests/factories.py."""

from tests.factories import incident_row  # noqa: F401  # moved: tests/factories.py
