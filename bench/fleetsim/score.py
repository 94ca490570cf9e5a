"""The scoreboard: Rebound's incidents and ledgers against the simulator's truth.

An incident matches an injected fault of its job when its `fault_at` lies in the
fault's window: from MATCH_BEFORE_S before the fault (a hang's incident starts at
the last progress, which precedes the fault) to MATCH_AFTER_S after the end of
what it caused (the launch's end; the straggler's end). Among several, the fault
on a node the incident names wins, then the nearest. Per class:

- injected, detected (faults with an incident), recall = detected / injected;
- typed: detected faults whose incident says the right kind (a crash found only
  as a failed launch is detected, not typed);
- precision: of the incidents whose fault type belongs to the class, the share
  that matched an injected fault;
- time to detect p50 / p95: the earliest matching incident's `detected_at` less
  the true fault time;
- false incidents (matched nothing) per 1,000 node-days, by fault type.

Planned stops (host maintenance) are injected but expected to open nothing: their
recall is not counted and an incident on one is a false incident. Repeat-offender
incidents judge nodes across faults, not one fault: counted apart.
Per job: goodput (productive / elapsed) from Rebound's ledger and from the truth,
and the absolute error in percentage points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetsim.sim import Fleet

MATCH_BEFORE_S = 300.0
MATCH_AFTER_S = 120.0
CLASSES = (
    "gpu_xid",
    "crash",
    "nccl_timeout",
    "hang",
    "dead_node",
    "straggler",
    "sdc",
    "planned",
)
# An incident's fault type -> the class it claims.
TYPE_CLASS = {
    "gpu_xid": "gpu_xid",
    "ecc": "gpu_xid",
    "crash": "crash",
    "nccl_timeout": "nccl_timeout",
    "network": "nccl_timeout",
    "hang": "hang",
    "dead_node": "dead_node",
    "straggler": "straggler",
    "nan": "sdc",
    "loss_spike": "sdc",
    "sdc": "sdc",
}
NOT_PER_FAULT = ("repeat_offender",)


@dataclass
class SeenIncident:
    job: str
    detector: str
    fault_type: str
    nodes: list[str]
    fault_at: float
    detected_at: float


def incidents_seen(job_keys: list[str]) -> list[SeenIncident]:
    """The incidents of these jobs, as the scoreboard reads them."""
    from incidents.models import Incident

    rows = Incident.objects.filter(job__key__in=job_keys).select_related("job")
    return [
        SeenIncident(
            i.job.key,
            i.detector,
            i.fault_type,
            [n.name for n in i.nodes.all()],
            i.fault_at.timestamp(),
            i.detected_at.timestamp() if i.detected_at else i.fault_at.timestamp(),
        )
        for i in rows.prefetch_related("nodes").order_by("fault_at", "id")
    ]


def goodput_seen(job_keys: list[str]) -> dict[str, float | None]:
    """Each job's goodput as Rebound's ledger computes it."""
    from jobs.accounting import compute_ledger, load_lifecycle, load_steps
    from jobs.models import TrainingJob

    out = {}
    for job in TrainingJob.objects.filter(key__in=job_keys):
        ledger = compute_ledger(
            job.key, load_lifecycle(job.id), load_steps(job.id), last_event_ts=job.last_event_ts
        )
        out[job.key] = ledger.goodput
    return out


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def scoreboard(
    fleet: Fleet, incidents: list[SeenIncident], goodput: dict[str, float | None]
) -> dict:
    faults = fleet.faults
    matched: dict[int, list[SeenIncident]] = {}  # fault index -> its incidents
    false: list[SeenIncident] = []
    per_fault = [i for i in incidents if i.detector not in NOT_PER_FAULT]
    for inc in per_fault:
        best, best_key = None, None
        for k, f in enumerate(faults):
            if f.job != inc.job:
                continue
            if not (f.ts - MATCH_BEFORE_S <= inc.fault_at <= f.until + MATCH_AFTER_S):
                continue
            key = (f.node not in inc.nodes, abs(inc.fault_at - f.ts))
            if best_key is None or key < best_key:
                best, best_key = k, key
        if best is None or faults[best].cls == "planned":
            false.append(inc)
        else:
            matched.setdefault(best, []).append(inc)

    false_ids = {id(i) for i in false}
    classes = {}
    node_days = fleet.node_days
    for cls in CLASSES:
        idx = [k for k, f in enumerate(faults) if f.cls == cls]
        found = [k for k in idx if k in matched]
        typed = [k for k in found if any(TYPE_CLASS.get(i.fault_type) == cls for i in matched[k])]
        named = [k for k in found if any(faults[k].node in i.nodes for i in matched[k])]
        ttd = [min(i.detected_at for i in matched[k]) - faults[k].ts for k in found]
        claimed = [i for i in per_fault if TYPE_CLASS.get(i.fault_type) == cls]
        true_claims = [i for i in claimed if id(i) not in false_ids]
        classes[cls] = {
            "injected": len(idx),
            "detected": len(found),
            "typed": len(typed),
            "node_named": len(named),
            "recall": None if cls == "planned" or not idx else len(found) / len(idx),
            "typed_recall": None if cls == "planned" or not idx else len(typed) / len(idx),
            "incidents": len(claimed),
            "precision": len(true_claims) / len(claimed) if claimed else None,
            "ttd_p50_s": _pct(ttd, 50),
            "ttd_p95_s": _pct(ttd, 95),
        }
    false_by_type: dict[str, int] = {}
    for i in false:
        false_by_type[i.fault_type] = false_by_type.get(i.fault_type, 0) + 1
    jobs = []
    for j in fleet.jobs:
        seen = goodput.get(j.key)
        jobs.append(
            {
                "job": j.key,
                "ranks": j.world_size,
                "goodput_true": j.goodput,
                "goodput_seen": seen,
                "error_pp": None if seen is None else abs(seen - j.goodput) * 100,
            }
        )
    return {
        "config": {
            "nodes": fleet.config.nodes,
            "days": fleet.config.days,
            "rate": fleet.config.rate,
            "seed": fleet.config.seed,
            "node_days": node_days,
            "events": len(fleet.events),
        },
        "classes": classes,
        "incidents": len(incidents),
        "repeat_offender_incidents": len(incidents) - len(per_fault),
        "false_incidents": len(false),
        "false_per_1000_node_days": len(false) / node_days * 1000 if node_days else None,
        "false_by_type": false_by_type,
        "jobs": jobs,
        "goodput_error_pp_max": max((j["error_pp"] or 0.0) for j in jobs) if jobs else None,
    }


def _f(v, fmt="{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(board: dict) -> str:
    c = board["config"]
    lines = [
        f"fleet: {c['nodes']} nodes x {c['days']:g} days ({c['node_days']:g} node-days),"
        f" {c['rate']:g} faults per 1,000 node-days, seed {c['seed']}, {c['events']:,} events",
        f"{'class':<13}{'inj':>5}{'det':>5}{'typed':>6}{'node':>5}{'recall':>8}"
        f"{'incid':>6}{'prec':>6}{'ttd p50':>9}{'ttd p95':>9}",
    ]
    for cls, r in board["classes"].items():
        lines.append(
            f"{cls:<13}{r['injected']:>5}{r['detected']:>5}{r['typed']:>6}{r['node_named']:>5}"
            f"{_f(r['recall']):>8}{r['incidents']:>6}{_f(r['precision']):>6}"
            f"{_f(r['ttd_p50_s'], '{:.0f}s'):>9}{_f(r['ttd_p95_s'], '{:.0f}s'):>9}"
        )
    lines.append(
        f"incidents {board['incidents']} (repeat offender {board['repeat_offender_incidents']}),"
        f" false {board['false_incidents']}"
        f" = {_f(board['false_per_1000_node_days'], '{:.1f}')} per 1,000 node-days"
        f" {board['false_by_type'] or ''}"
    )
    lines.append(f"{'job':<12}{'ranks':>6}{'goodput true':>14}{'rebound':>9}{'error pp':>10}")
    for j in board["jobs"]:
        lines.append(
            f"{j['job']:<12}{j['ranks']:>6}{_f(j['goodput_true'], '{:.4f}'):>14}"
            f"{_f(j['goodput_seen'], '{:.4f}'):>9}{_f(j['error_pp'], '{:.3f}'):>10}"
        )
    return "\n".join(lines)
