"""The figures of a launch's incidents, computed from the job's ledger and steps: when
training resumed and recovered, and the GPU-seconds lost, by category. Reads only;
incidents.services.incidents_update_figures stores them."""

from __future__ import annotations

import numpy as np

from common.time import dt
from incidents.models import Incident


def launch_failure_figures(incident: Incident, launches, k: int, steps) -> dict:
    """The last episode of launch k, which the launch did not survive: it resumed at
    the first step of a later launch and recovered at the first step past the
    highest before the fault; it lost the launch's wasted progress and stall, the
    downtime after it, and the next launch's startup and restore."""
    failed = launches[k]
    nxt = launches[k + 1] if k + 1 < len(launches) else None
    fault_ts = incident.fault_at.timestamp()
    later = {launch.number for launch in launches[k + 1 :]}

    resumed_at = recovered_at = None
    if len(steps.ts) and later:
        in_later = np.isin(steps.attempt, list(later))
        if in_later.any():
            resumed_at = dt(float(steps.ts[in_later].min()))
            before = steps.ts <= fault_ts
            highest = int(steps.step[before].max()) if before.any() else -1
            beyond = in_later & (steps.step > highest)
            if beyond.any():
                recovered_at = dt(float(steps.ts[beyond].min()))

    ws = failed.world_size
    breakdown = {
        "wasted_progress": failed.categories["wasted_progress"] * ws,
        "stalled": failed.categories["stalled"] * ws,
        "downtime": failed.gap_after_s * ws,
        "startup": (nxt.categories["startup"] * nxt.world_size) if nxt else 0.0,
        "checkpoint_restore": (nxt.categories["checkpoint_restore"] * nxt.world_size)
        if nxt
        else 0.0,
    }
    return {
        "relaunched_at": dt(nxt.start) if nxt else None,
        "restored_at": dt(training_start(nxt)) if nxt else None,
        "resumed_at": resumed_at,
        "recovered_at": recovered_at,
        "lost_breakdown": breakdown,
        "lost_gpu_seconds": sum(breakdown.values()),
    }


def training_start(launch) -> float:
    """When a launch could step: its state restored, else ready, else started, within
    the launch (the ledger's rule for where its first step's interval begins)."""
    start = max(launch.loaded or launch.ready or launch.start, launch.start)
    return min(start, launch.stop) if launch.stop else start


def survived(incident: Incident, launch, steps) -> bool:
    """A hang the launch came out of by itself: it completed, or stepped on past it."""
    if incident.fault_type != "hang":
        return False
    fault_ts = incident.fault_at.timestamp()
    return launch.completed or bool(
        ((steps.attempt == incident.attempt) & (steps.ts > fault_ts)).any()
    )


def in_launch_figures(incident: Incident, launch, steps) -> dict:
    """An episode the launch went on after: it resumed at the launch's next step and
    recovered at its first step past the highest before the fault. Its time stays
    inside steps in the ledger (no badput); what a hang the launch survived cost
    is its stall beyond the launch's usual step interval, x the world size, shown
    as slowdown (as a straggler's cost is)."""
    fault_ts = incident.fault_at.timestamp()
    same = (steps.attempt == incident.attempt) & (steps.ts > fault_ts)
    before = steps.ts <= fault_ts
    highest = int(steps.step[before].max()) if before.any() else -1
    beyond = same & (steps.step > highest)
    resumed = float(steps.ts[same].min()) if same.any() else None
    breakdown = {}
    if incident.fault_type == "hang" and resumed is not None:
        own = np.sort(steps.ts[steps.attempt == incident.attempt])
        usual = float(np.median(np.diff(own))) if len(own) > 2 else 0.0
        breakdown["slowdown"] = max(0.0, resumed - fault_ts - usual) * (launch.world_size or 1)
    return {
        "relaunched_at": None,
        "restored_at": None,
        "resumed_at": dt(resumed) if resumed is not None else None,
        "recovered_at": dt(float(steps.ts[beyond].min())) if beyond.any() else None,
        "lost_breakdown": breakdown,
        "lost_gpu_seconds": sum(breakdown.values()),
    }
