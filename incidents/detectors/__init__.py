"""Detection: what is wrong with a job, read from what it reported. Reads only; the
writes (opening and updating incidents, their timelines) are incidents.services'.

- `engine`: the incremental pass over a job's steps, rank windows and heartbeats,
  carrying each detector's state (`state`) from one pass to the next;
- one module per detector: `hang`, `loss`, `straggler` and `dead_node` (run by the
  engine), `episodes` (reported faults and failed launches, one incident each) and
  `crash_loop` (launches that keep failing);
- `ranks`: the per-rank scores both the straggler detector and the API's ranks
  endpoint use;
- `base`: what they share (a signal, a finding);
- `planned`: maintenance windows: nodes under maintenance raise nothing, and an
  interruption inside a window is `planned`.

`job_findings` puts them together for one pass.
"""

from __future__ import annotations

from incidents.detectors import crash_loop, episodes, planned, straggler
from incidents.detectors.base import Finding
from incidents.detectors.engine import Watch
from jobs.models import TrainingJob


def job_findings(*, job: TrainingJob, cfg: dict, watch: Watch | None) -> list[Finding]:
    """Every finding of the job: its launches' fault episodes, its crash loops and,
    with a `watch` (the full pass), its stragglers. `cfg`: the job's detector
    settings, read once for the pass. Maintenance windows (one query) spare their
    nodes and make the interruptions inside them `planned` (detectors.planned)."""
    spans = planned.job_spans(job)
    watch = planned.spare_watch(watch, spans)
    findings = planned.mark_planned(job, episodes.findings(job=job, cfg=cfg, watch=watch), spans)
    # A loop of launches failing mostly inside maintenance is the maintenance, not a
    # loop to stop: it opens nothing (and holds no launch back).
    findings += [
        f
        for f in crash_loop.findings(job=job, cfg=cfg, launch_findings=findings)
        if f.fields["cause"] != planned.PLANNED
    ]
    if watch is not None:
        findings += straggler.findings(watch.stragglers)
    return findings
