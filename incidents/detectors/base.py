"""What the detectors share: a signal (a fault, reported or inferred), a finding (one
episode as an incident's fields), and small helpers over a job's launches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jobs.accounting import Launch
from jobs.models import TrainingJob


@dataclass
class Signal:
    client_id: str  # the event's id, or "inferred:..." for what a detector inferred
    kind: str
    ts: float
    attempt: int | None
    node: str
    rank: int | None
    data: dict
    detected_ts: float | None = None  # when an inferred fault's condition was met


def signal_where(s: Signal) -> str:
    """Where a signal happened, in words ("n01 rank 3"), or "" when it names no place."""
    return " ".join(x for x in (s.node, f"rank {s.rank}" if s.rank is not None else "") if x)


@dataclass
class Finding:
    """What a detector found: one episode, as the incident's fields and its signals."""

    detector: str
    episode: str
    fields: dict
    nodes: list[str]
    signals: list[Signal]
    why: str = ""  # why this cause, for the timeline when it changes


def launch_stop(
    job: TrainingJob, launches: list[Launch], k: int, finished: float | None
) -> float | None:
    """Where launch k's time ends: its reported end, else the next launch's start,
    the job's finish or its latest event (an open tail)."""
    launch = launches[k]
    if launch.end is not None:
        return launch.end
    nxt = launches[k + 1].start if k + 1 < len(launches) else None
    return nxt or finished or job.last_event_ts


def by_launch(attempts: np.ndarray):
    """(launch number, the indexes of its rows) for each launch in `attempts`."""
    for number in np.unique(attempts).tolist():
        yield number, np.flatnonzero(attempts == number)
