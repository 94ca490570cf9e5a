import pytest

from incidents import services
from incidents.models import Incident
from jobs.models import TrainingJob


def detect(key: str) -> list[Incident]:
    """One detection pass and one figures pass over the job, as the task runs them."""
    job = TrainingJob.objects.get(key=key)
    services.incidents_detect(job=job)
    services.incidents_update_figures(job=job)
    return list(Incident.objects.filter(job=job).order_by("fault_at"))


@pytest.fixture
def incidents(ingest, sample):
    """The worked example's three incidents, detected."""
    events, _ = sample
    assert ingest(events).status_code == 202
    return detect("sample-small")
