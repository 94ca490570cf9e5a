"""console.whatif against the worked examples of shared/reference/goodput-and-ettr.md
(sections 0, 2, 3 and 4, and Appendix B), to the precision they are printed with.

Kokolis et al.'s examples count GPUs in thousands: "16k GPUs" is 16,000 (2,000 nodes
of 8), which gives the published 0.684 and 0.932 (16,384 GPUs would give 0.676 and
0.931); the job MTTFs are for 16,384 and 131,072 GPUs as printed.
"""

import math

import pytest

from console.whatif import (
    Quantity,
    daly_interval_s,
    expected_ettr,
    job_mttf_s,
    measure,
    mtbf_s,
    plan,
    young_interval_s,
)

MIN, HOUR, DAY = 60.0, 3600.0, 86_400.0
RSC1 = 6.50e-3  # failures per node-day, RSC-1


def ettr_for(gpus, *, r_f=RSC1, u0_min=5.0, interval_min=None, w_min=0.0, q_min=0.0):
    """E[ETTR] of a job of `gpus` GPUs (8 a node); Young's interval when none is given."""
    mttf = job_mttf_s(nodes=gpus // 8, failures_per_node_day=r_f)
    interval = (
        interval_min * MIN
        if interval_min is not None
        else young_interval_s(checkpoint_s=w_min * MIN, mtbf_s=mttf)
    )
    return expected_ettr(
        mtbf_s=mttf,
        restart_s=u0_min * MIN,
        interval_s=interval,
        checkpoint_s=w_min * MIN,
        wait_s=q_min * MIN,
    )


def test_job_mttf_at_16k_and_131k_gpus():
    assert round(job_mttf_s(nodes=16_384 // 8, failures_per_node_day=RSC1) / HOUR, 2) == 1.80
    assert round(job_mttf_s(nodes=131_072 // 8, failures_per_node_day=RSC1) / HOUR, 3) == 0.225


def test_expected_ettr_of_a_16k_gpu_job_with_hourly_and_5_minute_checkpoints():
    assert round(ettr_for(16_000, interval_min=60), 3) == 0.684
    assert round(ettr_for(16_000, interval_min=5), 3) == 0.932


def test_expected_ettr_of_an_8k_gpu_job_with_a_minute_of_queue_after_each_failure():
    assert round(ettr_for(8_000, interval_min=30, q_min=1), 3) == 0.905


def test_expected_ettr_at_12k_gpus_with_daly_young_optimal_checkpoints():
    assert round(ettr_for(12_000, w_min=5), 2) == 0.74  # the base case
    assert round(ettr_for(12_000, w_min=10 / 60), 3) == 0.921  # a 10 s checkpoint write
    assert round(ettr_for(12_000, w_min=5, r_f=1e-3), 3) == 0.898  # r_f down to about 1


@pytest.mark.parametrize(
    ("mtbf_h", "daly_min", "young_min"),
    [(24, 116.7, 120.0), (6, 56.7, 60.0), (0.25, 9.1, 12.2)],
)
def test_daly_and_young_intervals_of_dalys_published_cases(mtbf_h, daly_min, young_min):
    delta, m = 5 * MIN, mtbf_h * HOUR  # a 5 minute dump
    assert round(daly_interval_s(checkpoint_s=delta, mtbf_s=m) / MIN, 1) == daly_min
    assert round(young_interval_s(checkpoint_s=delta, mtbf_s=m) / MIN, 1) == young_min


def test_daly_interval_is_the_mtbf_once_a_checkpoint_costs_twice_as_much():
    assert daly_interval_s(checkpoint_s=2 * HOUR, mtbf_s=HOUR) == HOUR
    assert daly_interval_s(checkpoint_s=3 * HOUR, mtbf_s=HOUR) == HOUR


def test_llama3_mtbf_from_its_interruptions():
    elapsed = 54 * DAY
    assert round(mtbf_s(elapsed_s=elapsed, failures=419) / HOUR, 2) == 3.09  # unexpected
    assert round(mtbf_s(elapsed_s=elapsed, failures=466) / HOUR, 2) == 2.78  # all
    assert mtbf_s(elapsed_s=elapsed, failures=0) is None


def test_expected_ettr_stays_in_0_1_and_handles_a_free_checkpoint():
    assert expected_ettr(mtbf_s=HOUR, restart_s=HOUR, interval_s=HOUR, checkpoint_s=0) == 0.0
    assert expected_ettr(mtbf_s=DAY, restart_s=0, interval_s=0, checkpoint_s=0) == 1.0
    assert expected_ettr(mtbf_s=DAY, restart_s=0, interval_s=0, checkpoint_s=1) == 0.0
    # The model is a product of the two losses: lost work and checkpoint overhead.
    got = expected_ettr(mtbf_s=10 * HOUR, restart_s=6 * MIN, interval_s=HOUR, checkpoint_s=36)
    assert got == pytest.approx((1 - (0.1 + 0.5) / 10) / (1 + 0.01))


FIGURES = {
    "elapsed_s": 36_000.0,
    "categories": {
        "productive": 30_000.0,
        "startup": 300.0,  # 3 launches of 100 s
        "checkpoint_restore": 120.0,  # 2 restores of 60 s
        "checkpoint_save": 600.0,
        "wasted_progress": 2_000.0,
        "stalled": 400.0,
        "downtime": 200.0,
        "other": 2_380.0,
    },
}


def test_measure_takes_each_input_from_the_job():
    got = measure(
        figures=FIGURES,
        launches=3,
        failures=2,
        saves=100,
        save_gaps=97,
        save_span_s=97 * 300.0,
        blocking_sum_s=100 * 6.0,
        blocking_n=100,
    )
    assert got["mtbf"] == Quantity(18_000.0, "measured", got["mtbf"].note)
    assert got["restart"].value == pytest.approx(
        100 + 60
    )  # startup per launch, restore per relaunch
    assert got["wait"].value == pytest.approx((400 + 200) / 2)
    assert got["checkpoint"].value == pytest.approx(6.0)
    assert got["interval"].value == pytest.approx(300.0)
    assert all(q.source == "measured" for q in got.values())


def test_without_failures_or_saves_the_inputs_are_missing_not_invented():
    got = measure(
        figures=FIGURES,
        launches=1,
        failures=0,
        saves=0,
        save_gaps=0,
        save_span_s=0.0,
        blocking_sum_s=0.0,
        blocking_n=0,
    )
    assert got["mtbf"].value is None and got["mtbf"].source == "missing"
    assert "no failure" in got["mtbf"].note
    assert got["checkpoint"].value is None and got["interval"].value is None
    assert got["restart"].value == 300.0  # the one launch's startup, said so
    result = plan(measured=got, entered={})
    assert result["missing"] == ["mtbf", "checkpoint"] and result["rows"] == []
    assert result["inputs"]["wait"].value == 0.0 and result["inputs"]["wait"].source == "assumed"


def test_typed_values_win_and_give_the_intervals_and_expected_goodput():
    measured = measure(
        figures=FIGURES,
        launches=1,
        failures=0,
        saves=0,
        save_gaps=0,
        save_span_s=0.0,
        blocking_sum_s=0.0,
        blocking_n=0,
    )
    result = plan(
        measured=measured,
        entered={"mtbf": 10 * HOUR, "checkpoint": 30.0, "interval": 20 * MIN, "restart": None},
    )
    assert result["missing"] == []
    assert result["inputs"]["mtbf"].source == "entered"
    assert result["inputs"]["restart"].source == "measured"  # left blank: the measured one
    young = math.sqrt(2 * 30 * 10 * HOUR)
    assert result["young_s"] == pytest.approx(young)
    assert result["daly_s"] == pytest.approx(daly_interval_s(checkpoint_s=30, mtbf_s=10 * HOUR))
    assert result["waste_floor"] == pytest.approx(math.sqrt(2 * 30 / (10 * HOUR)))
    rows = {r["label"]: r for r in result["rows"]}
    assert rows["current interval"]["interval_s"] == 20 * MIN
    for row in rows.values():
        assert row["ettr"] == pytest.approx(
            expected_ettr(
                mtbf_s=10 * HOUR, restart_s=300.0, interval_s=row["interval_s"], checkpoint_s=30
            )
        )
    # Checkpointing every 20 minutes at 30 s a save is worse than the optimum.
    assert rows["Young optimum"]["ettr"] > rows["current interval"]["ettr"]
