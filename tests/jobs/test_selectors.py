"""The jobs app's reads never write: a selector that computes what is not stored (a
ledger, the step buckets, the job page's charts) leaves the database and the cache as
they were; the service of the same concern stores it for the next reader."""

import re
from contextlib import contextmanager

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs import selectors, services
from jobs.models import LedgerSnapshot, TrainingJob
from tests.jobs.test_read_api import ev, two_launches

pytestmark = pytest.mark.django_db

WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE|SAVEPOINT)\b", re.IGNORECASE)


@pytest.fixture
def job(ingest):
    """A job with no stored ledger and nothing cached (ingest may have refreshed both)."""
    assert ingest(two_launches()).status_code == 202
    LedgerSnapshot.objects.all().delete()
    cache.clear()
    return TrainingJob.objects.get(key="j1")


def writes(queries) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if WRITE.match(q["sql"])]


@contextmanager
def no_cache_writes():
    """Any write to the cache inside fails the test."""

    def refused(*args, **kwargs):
        raise AssertionError(f"a selector wrote the cache: {args[:1]}")

    with pytest.MonkeyPatch.context() as mp:
        for name in ("set", "set_many", "add", "delete", "delete_many", "incr", "touch"):
            mp.setattr(cache, name, refused)
        yield


def test_the_goodput_selector_computes_a_missing_ledger_without_storing_it(job):
    with CaptureQueriesContext(connection) as queries, no_cache_writes():
        figures = selectors.job_goodput(job=job)
    assert figures["elapsed_s"] == pytest.approx(39.0)
    assert writes(queries) == []
    assert not LedgerSnapshot.objects.filter(job=job).exists()

    # The service stores it; a read after it finds it current and computes nothing.
    assert services.job_goodput(job=job) == figures
    snapshot = LedgerSnapshot.objects.get(job=job)
    assert (snapshot.revision, snapshot.figures) == (job.revision, figures)
    job = TrainingJob.objects.select_related("ledger").get(pk=job.pk)
    with CaptureQueriesContext(connection) as queries:
        assert selectors.job_goodput(job=job) == figures
    assert len(queries) == 0


def test_a_stale_snapshot_is_recomputed_by_the_selector_and_replaced_by_the_service(job, ingest):
    services.ledger_snapshot_ensure(job=job)
    assert ingest([ev(14, "step", 40, attempt=2, step=5)]).status_code == 202
    LedgerSnapshot.objects.filter(job=job).update(revision=job.revision)  # as before it
    job = TrainingJob.objects.select_related("ledger").get(pk=job.pk)
    assert job.ledger.revision < job.revision
    assert selectors.job_goodput(job=job, allow_stale=True)["elapsed_s"] == pytest.approx(39.0)
    with CaptureQueriesContext(connection) as queries, no_cache_writes():
        assert selectors.job_goodput(job=job)["elapsed_s"] == pytest.approx(40.0)
    assert writes(queries) == []
    assert LedgerSnapshot.objects.get(job=job).revision < job.revision
    services.ledger_snapshot_ensure(job=job)
    assert LedgerSnapshot.objects.get(job=job).revision == job.revision


def test_the_step_buckets_selector_reads_the_cache_and_never_fills_it(job, ingest):
    key = selectors.step_buckets_key(job)
    with no_cache_writes():
        buckets = selectors.job_step_buckets(job=job)
    assert int(buckets.col("n").sum()) == job.steps.count() == 5
    assert buckets.cache_entry is not None  # what the service would store
    assert cache.get(key) is None

    stored = services.step_buckets_ensure(job=job)
    assert cache.get(key)["max_id"] == stored.cache_entry["max_id"]
    assert selectors.job_step_buckets(job=job).cache_entry is None  # the cache is current

    assert ingest([ev(14, "step", 40, attempt=2, step=5)]).status_code == 202
    job = TrainingJob.objects.get(pk=job.pk)
    cached = cache.get(key)
    with no_cache_writes():
        newer = selectors.job_step_buckets(job=job)  # the cached buckets and the new row
    assert int(newer.col("n").sum()) == 6
    assert cache.get(key)["max_id"] == cached["max_id"]  # untouched by the read


def test_the_chart_selectors_query_and_their_services_cache_per_revision(job):
    attempt, world_size = 2, 4
    with CaptureQueriesContext(connection) as queries, no_cache_writes():
        groups = selectors.job_checkpoint_groups(job=job, step_width=1)
        heatmap = selectors.job_rank_heatmap(job=job, attempt=attempt, world_size=world_size)
    assert writes(queries) == []
    assert groups and heatmap["attempt"] == attempt

    assert services.checkpoint_groups_ensure(job=job, step_width=1) == groups
    assert services.rank_heatmap_ensure(job=job, attempt=attempt, world_size=world_size) == heatmap
    with CaptureQueriesContext(connection) as queries:
        assert services.checkpoint_groups_ensure(job=job, step_width=1) == groups
        assert (
            services.rank_heatmap_ensure(job=job, attempt=attempt, world_size=world_size) == heatmap
        )
    assert len(queries) == 0


def test_the_latest_launch_and_durable_checkpoint_in_the_job_list(job):
    listed = selectors.job_list().get(pk=job.pk)
    assert listed.current_attempt_id == selectors.job_latest_attempt(job).pk
    assert listed.last_durable_checkpoint_id == selectors.job_latest_durable_checkpoint(job).pk
    assert selectors.job_status(job) == TrainingJob.Status.RUNNING
