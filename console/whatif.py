"""What-if for checkpointing: how often a job should checkpoint, and the goodput to
expect, from its own failure rate, restart cost and checkpoint cost.

The formulas (shared/reference/goodput-and-ettr.md, with its worked examples):

* Young 1974: tau = sqrt(2 x delta x M), delta the checkpoint cost, M the mean time
  between failures.
* Daly 2006, eq. 37: tau = sqrt(2 delta M) x [1 + 1/3 sqrt(delta / 2M) + 1/9 (delta / 2M)]
  - delta while delta < 2M; tau = M beyond.
* Expected ETTR (Kokolis et al. 2024, "Revisiting Reliability in Large-Scale Machine
  Learning Research Clusters"): E[ETTR] = (1 - (u0 + q + dt / 2) / M) / (1 + w / dt),
  with u0 the restart overhead, q the wait after each failure, dt the checkpoint
  interval and w the time a checkpoint blocks training. M = 1 / (N_nodes x r_f). A
  first-order model: it holds while u0 + q + dt / 2 is well below M.

Every quantity is in seconds. Nothing here reads the database: the page measures
the inputs (`measure`) from the ledger and a few counts, and the user may type over
any of them (`plan`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DAY_S = 86_400.0
NAMES = ("mtbf", "restart", "wait", "checkpoint", "interval")


def young_interval_s(*, checkpoint_s: float, mtbf_s: float) -> float:
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval_s(*, checkpoint_s: float, mtbf_s: float) -> float:
    if checkpoint_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = checkpoint_s / (2.0 * mtbf_s)
    return (
        math.sqrt(2.0 * checkpoint_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - checkpoint_s
    )


def expected_ettr(
    *, mtbf_s: float, restart_s: float, interval_s: float, checkpoint_s: float, wait_s: float = 0.0
) -> float:
    """Kokolis et al.'s expected ETTR, in [0, 1] (0 where the model's losses exceed M)."""
    lost = 1.0 - (restart_s + wait_s + interval_s / 2.0) / mtbf_s
    if interval_s > 0:
        overhead = checkpoint_s / interval_s
    else:
        overhead = 0.0 if checkpoint_s == 0 else math.inf
    return min(1.0, max(0.0, lost / (1.0 + overhead)))


def job_mttf_s(*, nodes: int, failures_per_node_day: float) -> float:
    """A job's mean time to failure from its node count and the per-node failure rate."""
    return DAY_S / (nodes * failures_per_node_day)


def mtbf_s(*, elapsed_s: float, failures: int) -> float | None:
    return elapsed_s / failures if failures else None


@dataclass(frozen=True)
class Quantity:
    """One input of the model: its value in seconds (None: unknown), where it comes
    from ('measured', 'entered' or 'missing') and how it was measured or why not."""

    value: float | None
    source: str  # measured, entered, assumed or missing
    note: str


def _known(value: float, note: str) -> Quantity:
    return Quantity(value, "measured", note)


def _missing(note: str) -> Quantity:
    return Quantity(None, "missing", note)


def measure(
    *,
    figures: dict,
    launches: int,
    failures: int,
    saves: int,
    save_gaps: int,
    save_span_s: float,
    blocking_sum_s: float,
    blocking_n: int,
) -> dict[str, Quantity]:
    """The model's inputs as the job measured them.

    `figures` is the cumulative ledger (jobs.selectors.job_goodput); `failures` the
    job's failures (incidents.selectors.is_failure: the incidents that interrupted it);
    `save_gaps` and `save_span_s` the number of intervals between consecutive saves of
    a launch and their total length; `blocking_*` the saves' reported blocking.
    """
    cats = figures.get("categories") or {}
    elapsed = figures.get("elapsed_s") or 0.0
    out: dict[str, Quantity] = {}

    if failures and elapsed > 0:
        out["mtbf"] = _known(
            elapsed / failures, f"{elapsed / 3600:.2f} h elapsed / {failures} failure(s)"
        )
    else:
        out["mtbf"] = _missing("no failure so far: type a mean time between failures")

    startup, restore = cats.get("startup", 0.0), cats.get("checkpoint_restore", 0.0)
    relaunches = launches - 1
    if relaunches > 0:
        out["restart"] = _known(
            startup / launches + restore / relaunches,
            f"startup per launch ({launches}) + checkpoint restore per relaunch ({relaunches})",
        )
    elif launches == 1:
        out["restart"] = Quantity(
            startup,
            "measured",
            "startup of the first launch; no relaunch yet, so no restore measured",
        )
    else:
        out["restart"] = _missing("no launch yet")

    if failures:
        wait = (cats.get("stalled", 0.0) + cats.get("downtime", 0.0)) / failures
        out["wait"] = _known(wait, "stalled + downtime per failure: noticing it, relaunching")
    else:
        out["wait"] = _missing("no failure so far: 0 unless typed")

    if blocking_n:
        out["checkpoint"] = _known(
            blocking_sum_s / blocking_n, f"mean blocking of {blocking_n} save(s)"
        )
    elif saves and cats.get("checkpoint_save", 0.0) > 0:
        out["checkpoint"] = _known(
            cats["checkpoint_save"] / saves, f"ledger's save time / {saves} save(s)"
        )
    else:
        out["checkpoint"] = _missing("no save measured yet")

    if save_gaps:
        out["interval"] = _known(
            save_span_s / save_gaps, f"mean time between saves ({save_gaps} interval(s))"
        )
    else:
        out["interval"] = _missing("fewer than two saves in a launch")
    return out


def plan(*, measured: dict[str, Quantity], entered: dict[str, float | None]) -> dict:
    """The inputs (typed values win over measured ones), the optimal intervals and the
    expected goodput at the current interval and at the optimal ones."""
    inputs = dict(measured)
    for name in NAMES:
        value = entered.get(name)
        if value is not None:
            inputs[name] = Quantity(float(value), "entered", "typed")
    if inputs.get("wait") is None or inputs["wait"].value is None:
        inputs["wait"] = Quantity(0.0, "assumed", "not measured: taken as 0")
    value = {name: q.value if q else None for name, q in inputs.items()}
    mtbf, checkpoint = value.get("mtbf"), value.get("checkpoint")
    missing = [n for n in ("mtbf", "restart", "checkpoint") if value.get(n) is None]
    out = {"inputs": inputs, "missing": missing, "rows": [], "young_s": None, "daly_s": None}
    if mtbf is None or checkpoint is None or mtbf <= 0:
        return out
    out["young_s"] = young_interval_s(checkpoint_s=checkpoint, mtbf_s=mtbf)
    out["daly_s"] = daly_interval_s(checkpoint_s=checkpoint, mtbf_s=mtbf)
    out["waste_floor"] = math.sqrt(2.0 * checkpoint / mtbf)
    if value.get("restart") is None:
        return out
    candidates = [
        ("current interval", value.get("interval")),
        ("Young optimum", out["young_s"]),
        ("Daly optimum", out["daly_s"]),
    ]
    for label, interval in candidates:
        if interval is None:
            continue
        out["rows"].append(
            {
                "label": label,
                "interval_s": interval,
                "ettr": expected_ettr(
                    mtbf_s=mtbf,
                    restart_s=value["restart"],
                    interval_s=interval,
                    checkpoint_s=checkpoint,
                    wait_s=value["wait"],
                ),
            }
        )
    return out
