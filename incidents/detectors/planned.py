"""Maintenance windows in detection (jobs.selectors.maintenance): a node under planned
maintenance is not dead or slow, it is being worked on, and a launch interrupted
inside a window was interrupted by plan.

- `spare_watch`: drops the dead-node and straggler findings of nodes inside a window
  at the time (on the job's clock): they open nothing.
- `mark_planned`: an episode whose fault falls inside a window covering one of its
  nodes (those it names, else its launch's) or its whole cluster is of cause
  `planned`; its fault type stays and its summary names the window.

Both are recomputed on every pass from the windows as they stand, so a window
declared after the fact re-labels the incidents inside it on their job's next pass,
and a cancelled one gives them back the cause their signals point to (the receiver
of `maintenance_changed` asks for those passes).
"""

from __future__ import annotations

from dataclasses import replace

from incidents.detectors.base import Finding
from incidents.detectors.engine import Watch
from incidents.models import Incident
from jobs.models import Attempt, TrainingJob
from jobs.selectors import Span, maintenance_spans, span_covering

PLANNED = Incident.Cause.PLANNED


def job_spans(job: TrainingJob) -> list[Span]:
    """The windows since the job's first event (a sweep judges a silent job on a clock
    past its last one): one query."""
    if job.first_event_ts is None:
        return []
    return maintenance_spans(cluster_id=job.cluster_id, start=job.first_event_ts)


def spare_watch(watch: Watch | None, spans: list[Span]) -> Watch | None:
    """The watch without dead nodes and stragglers under maintenance at the time."""
    if watch is None or not spans:
        return watch
    return replace(
        watch,
        dead_nodes=[s for s in watch.dead_nodes if not span_covering(spans, s.ts, [s.node])],
        stragglers=[s for s in watch.stragglers if not span_covering(spans, s.first_ts, [s.node])],
    )


def mark_planned(job: TrainingJob, findings: list[Finding], spans: list[Span]) -> list[Finding]:
    """The findings, those inside a window of cause `planned` (see the module)."""
    if not spans or not findings:
        return findings
    launch_nodes: dict[int, list[str]] = {}
    for number, name in Attempt.nodes.through.objects.filter(attempt__job=job).values_list(
        "attempt__number", "node__name"
    ):
        launch_nodes.setdefault(number, []).append(name)
    out = []
    for finding in findings:
        fields = finding.fields
        names = finding.nodes or launch_nodes.get(fields.get("attempt"), [])
        span = span_covering(spans, fields["fault_at"].timestamp(), names)
        if span is None:
            out.append(finding)
            continue
        was = fields["cause"]
        fields = fields | {
            "cause": PLANNED,
            "summary": f"planned ({span.describe()}): {fields['summary']}"[:300],
        }
        why = f"the fault fell inside {span.describe()} (its signals point to {was})"
        out.append(replace(finding, fields=fields, why=why))
    return out
