"""Build compute_ledger's arguments from wire-like events, as the loader would."""

import numpy as np

from common.vocabulary import TIMELINE_KINDS
from jobs.accounting import Steps, compute_ledger


def build(events):
    """The arguments of compute_ledger, as the loader would make them from these events.

    Arrival order is list order: lifecycle sorted by (ts, arrival), steps keep
    their arrival number in `seq`, `last_event_ts` is the latest event of any kind.
    """
    indexed = list(enumerate(events))
    lifecycle = [
        (e["kind"], e["ts"], e.get("attempt"), e["data"])
        for _, e in sorted(indexed, key=lambda ie: (ie[1]["ts"], ie[0]))
        if e["kind"] in TIMELINE_KINDS
    ]
    step_events = [(i, e) for i, e in indexed if e["kind"] == "step"]
    steps = Steps(
        np.array([e["attempt"] for _, e in step_events], dtype=np.int64),
        np.array([e["data"]["step"] for _, e in step_events], dtype=np.int64),
        np.array([e["ts"] for _, e in step_events], dtype=np.float64),
        np.array([i for i, _ in step_events], dtype=np.int64),
    )
    last = max((e["ts"] for e in events), default=None)
    return lifecycle, steps, last


def ledger_of(events, start=None, end=None):
    """The ledger of `events`, over [start, end] when given (absolute seconds)."""
    lifecycle, steps, last = build(events)
    return compute_ledger("job", lifecycle, steps, last_event_ts=last, start=start, end=end)
