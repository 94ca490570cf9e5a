"""The data step of the migration that removed the never-set `mitigating` state."""

import importlib

import pytest
from django.apps import apps

from incidents.models import Incident

pytestmark = pytest.mark.django_db

step = importlib.import_module("incidents.migrations.0006_remove_mitigating_state")


def test_mitigating_incidents_become_open(incidents):
    first, *others = incidents
    Incident.objects.filter(pk=first.pk).update(state="mitigating")
    before = {i.pk: i.state for i in others}
    step.mitigating_to_open(apps, None)
    assert Incident.objects.get(pk=first.pk).state == Incident.State.OPEN
    assert {i.pk: i.state for i in Incident.objects.exclude(pk=first.pk)} == before
    assert "mitigating" not in Incident.State.values
    assert Incident.OPEN_STATES == (Incident.State.OPEN,)
