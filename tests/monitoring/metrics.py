"""What the monitoring tests share: scraping /metrics and reading its families."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from jobs.models import TrainingJob


def scrape(client, **headers) -> str:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return response.content.decode()


def families(text: str) -> dict:
    """Family name -> family; prometheus_client's parser (it raises on a bad line)."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict, sample: str, **labels) -> float | None:
    """The value of the sample named `sample` whose labels include `labels`; None when
    absent. The family is found by the sample name's stem."""
    for fam in fams.values():
        for s in fam.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def exposed_names(text: str) -> set[str]:
    """Every sample name the text format may carry, from its TYPE lines (a histogram's
    _bucket, _sum and _count), whether or not the family has samples now."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        names.add(name)
        if kind == "histogram":
            names.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
    return names


def sample_job(ingest, sample) -> TrainingJob:
    """The design's worked example ingested, its incidents detected and its ledger stored."""
    from incidents import services
    from jobs.tasks import ledger_snapshot_refresh

    events, _ = sample
    assert ingest(events).status_code == 202
    job = TrainingJob.objects.get(key="sample-small")
    services.incidents_detect(job=job)
    ledger_snapshot_refresh(job.id)
    return job
