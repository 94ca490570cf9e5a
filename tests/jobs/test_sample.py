"""The worked example of the design: posted as a client would, it gives the contract's figures."""

import random

import pytest

from jobs.models import TrainingJob
from jobs.selectors import job_goodput

TOL = 1e-4


def assert_figures(figures, expected):
    assert figures["elapsed_s"] == pytest.approx(expected["elapsed_s"], abs=TOL)
    for name, seconds in expected["categories"].items():
        assert figures["categories"][name] == pytest.approx(seconds, abs=TOL), name
    for name, gpu_s in expected["gpu_categories"].items():
        assert figures["gpu_seconds"][name] == pytest.approx(gpu_s, abs=TOL * 8), name
    assert figures["goodput"] == pytest.approx(expected["goodput"], abs=1e-6)
    assert figures["gpu_goodput"] == pytest.approx(expected["gpu_goodput"], abs=1e-6)
    assert figures["slowdown_s"] == pytest.approx(expected["slowdown_s"], abs=1e-3)


def post_in_batches(ingest, events, size):
    for i in range(0, len(events), size):
        r = ingest(events[i : i + size])
        assert r.status_code == 202, r.content


@pytest.mark.django_db
def test_sample_in_one_batch_gives_the_contract_figures(ingest, sample):
    events, expected = sample
    r = ingest(events)
    assert r.status_code == 202
    assert r.json() == {"accepted": len(events), "duplicates": 0}
    job = TrainingJob.objects.get(key="sample-small")
    assert_figures(job_goodput(job=job), expected)


@pytest.mark.django_db
def test_sample_twice_and_shuffled_gives_the_same_figures(ingest, sample):
    events, expected = sample
    shuffled = events[:]
    random.Random(7).shuffle(shuffled)
    post_in_batches(ingest, shuffled, 97)
    r = ingest(events)
    assert r.json() == {"accepted": 0, "duplicates": len(events)}
    job = TrainingJob.objects.get(key="sample-small")
    assert_figures(job_goodput(job=job), expected)
