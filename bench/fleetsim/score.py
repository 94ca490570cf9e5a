"""The scoreboard: Rebound's incidents and ledgers against the simulator's truth.

An incident matches an injected fault of its job when its `fault_at` lies in the
fault's window: from MATCH_BEFORE_S before the fault (a hang's incident starts at
the last progress, which precedes the fault) to MATCH_AFTER_S after the end of
what it caused (the launch's end; the straggler's end). Among several, the fault
of the class the incident claims wins, then one on a node it names, then the nearest.
Per class:

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
and crash-loop incidents judge nodes or launches across faults, not one fault:
counted apart.
Per job: goodput (productive / elapsed) and lost GPU-hours (every GPU-second not
productive) from Rebound's ledger and from the truth: the absolute error of goodput
in percentage points, the relative error of the loss.
Per interruption found (sim.INTERRUPTING): the incident's lost GPU-hours, resumed
and recovered times against the truth (sim.TrueFault.figures), from the matching
incident that carries the launch's cost; per class the worst relative error of the
loss and the worst error of the times, in seconds.
The reliability report (incidents.selectors.reliability) over the run: failures in
all and by cause, and MTBF, against the interruptions injected by the cause each
stands for (sim.CAUSES).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetsim.sim import CAUSES, INTERRUPTING, T0, Fleet

# A straggler Rebound should find: 1.5x or worse (the straggler detector's threshold is
# 1.33x), slow for at least this many rank windows (it needs 3 in a row, complete).
STRAGGLER_FACTOR = 1.5
STRAGGLER_WINDOWS = 4
MATCH_BEFORE_S = 300.0
MATCH_AFTER_S = 120.0
CLASSES = (
    "gpu_xid",
    "crash",
    "nccl_timeout",
    "hang",
    "dead_node",
    "straggler",
    "straggler_1.5x",
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
NOT_PER_FAULT = ("repeat_offender", "crash_loop")
SUBCLASS_OF = {"straggler_1.5x": "straggler"}  # a class counted apart: what it claims


@dataclass
class SeenIncident:
    job: str
    detector: str
    fault_type: str
    nodes: list[str]
    fault_at: float
    detected_at: float
    cause: str = ""
    lost_gpu_s: float = 0.0
    resumed_at: float | None = None
    recovered_at: float | None = None


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
            i.cause,
            i.lost_gpu_seconds,
            i.resumed_at.timestamp() if i.resumed_at else None,
            i.recovered_at.timestamp() if i.recovered_at else None,
        )
        for i in rows.prefetch_related("nodes").order_by("fault_at", "id")
    ]


def ledger_seen(job_keys: list[str]) -> dict[str, dict]:
    """Each job's goodput and lost GPU-hours (every GPU-second not productive) as
    Rebound's ledger computes them."""
    from jobs.accounting import compute_ledger, load_lifecycle, load_steps
    from jobs.models import TrainingJob

    out = {}
    for job in TrainingJob.objects.filter(key__in=job_keys):
        ledger = compute_ledger(
            job.key, load_lifecycle(job.id), load_steps(job.id), last_event_ts=job.last_event_ts
        )
        lost = sum(v for k, v in ledger.gpu_seconds.items() if k != "productive")
        out[job.key] = {"goodput": ledger.goodput, "lost_gpu_hours": lost / 3600}
    return out


def reliability_seen(cluster: str, days: float) -> dict:
    """The reliability report over the run's span, as the API gives it."""
    from common.time import dt
    from incidents.selectors import reliability

    return reliability(cluster=cluster, start=dt(T0), end=dt(T0 + days * 86400))


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def scoreboard(
    fleet: Fleet,
    incidents: list[SeenIncident],
    ledgers: dict[str, dict],
    report: dict | None = None,
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
            key = (
                TYPE_CLASS.get(inc.fault_type) != f.cls,
                f.node not in inc.nodes,
                abs(inc.fault_at - f.ts),
            )
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
        idx = [k for k, f in enumerate(faults) if _in_class(f, cls, fleet)]
        found = [k for k in idx if k in matched]
        typed = [
            k
            for k in found
            if any(TYPE_CLASS.get(i.fault_type) == faults[k].cls for i in matched[k])
        ]
        named = [k for k in found if any(faults[k].node in i.nodes for i in matched[k])]
        ttd = [min(i.detected_at for i in matched[k]) - faults[k].ts for k in found]
        claimed = [
            i for i in per_fault if TYPE_CLASS.get(i.fault_type) == SUBCLASS_OF.get(cls, cls)
        ]
        true_claims = [i for i in claimed if id(i) not in false_ids]
        figures = [_figures_error(faults[k], matched[k]) for k in found if cls in INTERRUPTING]
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
            "lost_error_max": _worst(figures, "lost"),
            "resumed_error_max_s": _worst(figures, "resumed_s"),
            "recovered_error_max_s": _worst(figures, "recovered_s"),
        }
    false_by_type: dict[str, int] = {}
    for i in false:
        false_by_type[i.fault_type] = false_by_type.get(i.fault_type, 0) + 1
    jobs = []
    for j in fleet.jobs:
        seen = ledgers.get(j.key) or {"goodput": None, "lost_gpu_hours": None}
        lost_true = (j.elapsed_s - j.categories["productive"]) * j.world_size / 3600
        lost = seen["lost_gpu_hours"]
        jobs.append(
            {
                "job": j.key,
                "ranks": j.world_size,
                "goodput_true": j.goodput,
                "goodput_seen": seen["goodput"],
                "error_pp": None
                if seen["goodput"] is None
                else abs(seen["goodput"] - j.goodput) * 100,
                "lost_gpu_hours_true": lost_true,
                "lost_gpu_hours_seen": lost,
                "lost_error": None
                if lost is None or not lost_true
                else abs(lost - lost_true) / lost_true,
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
        "false_per_day": len(false) / fleet.config.days if fleet.config.days else None,
        "false_by_type": false_by_type,
        "jobs": jobs,
        "goodput_error_pp_max": max((j["error_pp"] or 0.0) for j in jobs) if jobs else None,
        "lost_error_max": max((j["lost_error"] or 0.0) for j in jobs) if jobs else None,
        "missed": [
            {
                "class": f.cls,
                "job": f.job,
                "node": f.node,
                "attempt": f.attempt,
                "at": f.ts - T0,
                "lasted_s": f.until - f.ts,
                **f.detail,
            }
            for k, f in enumerate(faults)
            if k not in matched and f.cls != "planned"
        ],
        # One incident per fault is the promise: the faults that opened more.
        "doubled": [
            {
                "class": faults[k].cls,
                "job": faults[k].job,
                "attempt": faults[k].attempt,
                "at": faults[k].ts - T0,
                "incidents": [
                    {"type": i.fault_type, "nodes": i.nodes, "at": i.fault_at - T0} for i in incs
                ],
            }
            for k, incs in sorted(matched.items())
            if len(incs) > 1
        ],
        "false": [
            {"type": i.fault_type, "job": i.job, "nodes": i.nodes, "at": i.fault_at - T0}
            for i in false
        ],
        "reliability": _reliability(fleet, report) if report is not None else None,
    }


def _in_class(fault, cls: str, fleet: Fleet) -> bool:
    """`straggler_1.5x`: the stragglers Rebound should find (STRAGGLER_FACTOR, _WINDOWS)."""
    if cls != "straggler_1.5x":
        return fault.cls == cls
    if fault.cls != "straggler" or fault.detail["factor"] < STRAGGLER_FACTOR:
        return False
    step_s = fleet.config.step_s * (0.8 * fault.detail["factor"] + 0.2)  # as it slows them
    return fault.until - fault.ts >= STRAGGLER_WINDOWS * fleet.config.window_steps * step_s


def _figures_error(fault, incidents: list[SeenIncident]) -> dict:
    """The interruption's figures against those of its incident that carries the cost:
    the loss's relative error, the times' errors in seconds (None where either side
    has no such time; inf where only one side has it)."""
    inc = max(incidents, key=lambda i: i.lost_gpu_s)
    truth = fault.figures
    lost = (
        abs(inc.lost_gpu_s - truth["lost_gpu_s"]) / truth["lost_gpu_s"]
        if truth["lost_gpu_s"]
        else None
    )
    out = {"lost": lost}
    for name in ("resumed", "recovered"):
        t, s = truth[f"{name}_at"], getattr(inc, f"{name}_at")
        out[f"{name}_s"] = (
            None
            if t is None and s is None
            else (abs(t - s) if t is not None and s is not None else float("inf"))
        )
    return out


def _worst(errors: list[dict], name: str) -> float | None:
    values = [e[name] for e in errors if e[name] is not None]
    return max(values) if values else None


def _reliability(fleet: Fleet, report: dict) -> dict:
    """Failures by cause: injected (the cause each class stands for) and reported."""
    true: dict[str, int] = {}
    for f in fleet.faults:
        if f.cls in INTERRUPTING:
            true[CAUSES[f.cls]] = true.get(CAUSES[f.cls], 0) + 1
    seen = {cause: c["failures"] for cause, c in report["by_cause"].items() if c["failures"]}
    period_s = fleet.config.days * 86400
    failures = sum(true.values())
    return {
        "failures_true": failures,
        "failures_seen": report["failures"],
        "by_cause": {c: [true.get(c, 0), seen.get(c, 0)] for c in sorted({*true, *seen})},
        "mtbf_true_s": period_s / failures if failures else None,
        "mtbf_seen_s": report["mtbf_s"],
        "lost_gpu_hours_true": sum(f.figures["lost_gpu_s"] for f in fleet.faults if f.figures)
        / 3600,
        # A straggler's cost is slowdown, not an interruption's: left out
        "lost_gpu_hours_seen": sum(
            c["lost_gpu_hours"] for cause, c in report["by_cause"].items() if cause != "straggler"
        ),
    }


def _f(v, fmt="{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(board: dict) -> str:
    c = board["config"]
    lines = [
        f"fleet: {c['nodes']} nodes x {c['days']:g} days ({c['node_days']:g} node-days),"
        f" {c['rate']:g} faults per 1,000 node-days, seed {c['seed']}, {c['events']:,} events",
        f"{'class':<13}{'inj':>5}{'det':>5}{'typed':>6}{'node':>5}{'recall':>8}"
        f"{'incid':>6}{'prec':>6}{'ttd p50':>9}{'ttd p95':>9}"
        f"{'lost err':>10}{'resume err':>11}{'recover err':>12}",
    ]
    for cls, r in board["classes"].items():
        lines.append(
            f"{cls:<13}{r['injected']:>5}{r['detected']:>5}{r['typed']:>6}{r['node_named']:>5}"
            f"{_f(r['recall']):>8}{r['incidents']:>6}{_f(r['precision']):>6}"
            f"{_f(r['ttd_p50_s'], '{:.0f}s'):>9}{_f(r['ttd_p95_s'], '{:.0f}s'):>9}"
            f"{_f(r['lost_error_max'], '{:.2%}'):>10}{_f(r['resumed_error_max_s'], '{:.1f}s'):>11}"
            f"{_f(r['recovered_error_max_s'], '{:.1f}s'):>12}"
        )
    lines.append(
        f"incidents {board['incidents']} (repeat offender {board['repeat_offender_incidents']}),"
        f" false {board['false_incidents']}"
        f" = {_f(board['false_per_1000_node_days'], '{:.1f}')} per 1,000 node-days"
        f" ({_f(board['false_per_day'], '{:.2f}')} a day)"
        f" {board['false_by_type'] or ''}"
    )
    for f in board["missed"]:
        lines.append(
            f"missed: {f['class']} {f['job']} {f['node']} launch {f['attempt']} at {f['at']:.0f} s"
            + (f" ({f['factor']:.2f}x for {f['lasted_s']:.0f} s)" if "factor" in f else "")
        )
    for d in board["doubled"]:
        said = ", ".join(f"{i['type']} at {i['at']:.0f} s" for i in d["incidents"])
        lines.append(
            f"doubled: {d['class']} {d['job']} launch {d['attempt']} at {d['at']:.0f} s: {said}"
        )
    for i in board["false"]:
        lines.append(f"false: {i['type']} {i['job']} {i['nodes']} at {i['at']:.0f} s")
    rel = board["reliability"]
    if rel:
        by_cause = ", ".join(f"{c} {t}/{s}" for c, (t, s) in rel["by_cause"].items())
        lines.append(
            f"reliability report: failures {rel['failures_true']} injected,"
            f" {rel['failures_seen']} reported; by cause (injected/reported) {by_cause};"
            f" MTBF {_f(rel['mtbf_true_s'], '{:.0f}')} s / {_f(rel['mtbf_seen_s'], '{:.0f}')} s;"
            f" lost {rel['lost_gpu_hours_true']:.1f} / {rel['lost_gpu_hours_seen']:.1f} GPU-hours"
        )
    lines.append(
        f"{'job':<12}{'ranks':>6}{'goodput true':>14}{'rebound':>9}{'error pp':>10}"
        f"{'lost GPU-h true':>17}{'rebound':>10}{'error':>8}"
    )
    for j in board["jobs"]:
        lines.append(
            f"{j['job']:<12}{j['ranks']:>6}{_f(j['goodput_true'], '{:.4f}'):>14}"
            f"{_f(j['goodput_seen'], '{:.4f}'):>9}{_f(j['error_pp'], '{:.3f}'):>10}"
            f"{_f(j['lost_gpu_hours_true'], '{:.1f}'):>17}"
            f"{_f(j['lost_gpu_hours_seen'], '{:.1f}'):>10}"
            f"{_f(j['lost_error'], '{:.2%}'):>8}"
        )
    return "\n".join(lines)
