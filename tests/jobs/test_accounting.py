"""Goodput accounting on hand-built traces.

Every trace below is written as the job would report it (wire-like events), and
every figure is worked out by hand in a comment beside it, from the rules of
the design contract (../shared/design.md, "Goodput accounting"). Times are
seconds after T0; numbers are chosen so that every sum is exact in binary.
"""

import itertools
import math

import pytest

from jobs.accounting import CATEGORIES, compute_ledger
from tests.jobs.traces import build, ledger_of

T0 = 1_700_000_000.0


# --- a tiny trace language ------------------------------------------------------


def ev(kind, t, attempt=1, **data):
    """An event `t` seconds after T0."""
    return {"kind": kind, "ts": T0 + t, "attempt": attempt, "data": data}


def started(t, attempt=1, world_size=1):
    return ev("attempt_started", t, attempt, world_size=world_size)


def ended(t, attempt=1, reason="completed"):
    return ev("attempt_ended", t, attempt, reason=reason)


def fault(t, type_="crash"):
    return {"kind": "fault", "ts": T0 + t, "attempt": None, "data": {"type": type_}}


def heartbeat(t):
    return {"kind": "heartbeat", "ts": T0 + t, "attempt": None, "data": {}}


def steps(attempt, first_step, times):
    """Step events: `first_step`, `first_step + 1`, ... finishing at `times`."""
    return [ev("step", t, attempt, step=first_step + i) for i, t in enumerate(times)]


def ledger(events, start=None, end=None):
    """The ledger of `events`; `start` and `end` in seconds after T0."""
    return ledger_of(
        events,
        start=None if start is None else T0 + start,
        end=None if end is None else T0 + end,
    )


def assert_partition(led):
    """The categories sum to the elapsed time; the GPU-seconds are non-negative."""
    assert set(led.categories) == set(CATEGORIES)
    assert set(led.gpu_seconds) == set(CATEGORIES)
    assert math.fsum(led.categories.values()) == pytest.approx(led.elapsed_s, rel=1e-9, abs=1e-12)
    for name in CATEGORIES:
        assert led.categories[name] >= -1e-9, name
        assert led.gpu_seconds[name] >= -1e-9, name


def assert_ledger(led, elapsed, expected, gpu=None, world_size=None):
    """`expected` names the non-zero categories; the others must be 0."""
    assert_partition(led)
    assert led.elapsed_s == pytest.approx(elapsed, abs=1e-6)
    want = dict.fromkeys(CATEGORIES, 0.0) | expected
    got = {name: pytest.approx(want[name], abs=1e-6) for name in CATEGORIES}
    assert led.categories == got
    if world_size is not None:
        gpu = {name: secs * world_size for name, secs in want.items()}
    if gpu is not None:
        want_gpu = dict.fromkeys(CATEGORIES, 0.0) | gpu
        assert led.gpu_seconds == {
            name: pytest.approx(want_gpu[name], abs=1e-6) for name in CATEGORIES
        }
        total = math.fsum(want_gpu.values())
        assert led.gpu_goodput == pytest.approx(want_gpu["productive"] / total, rel=1e-9)
    if elapsed > 0:
        assert led.goodput == pytest.approx(want["productive"] / elapsed, rel=1e-9)


def add(*ledgers):
    out = dict.fromkeys(CATEGORIES, 0.0)
    gpu = dict.fromkeys(CATEGORIES, 0.0)
    for led in ledgers:
        for name in CATEGORIES:
            out[name] += led.categories[name]
            gpu[name] += led.gpu_seconds[name]
    return out, gpu


# --- the traces -------------------------------------------------------------------


def crash_and_restart():
    """8 GPUs; a crash after step 8, a restart from the checkpoint of step 5.

    Launch 1: start 0, ready 10, steps 1..5 at 12..20 (2 s each), a blocking
    save of step 5 20 -> 23 (blocking_s 3), steps 6..8 at 25, 27, 29, a crash
    at 30, attempt_ended (failed) at 35.
    Launch 2: start 50, ready 55, load 56 -> 60 (step 5), steps 6..10 at
    62..70, completed at 72; job_finished at 73.
    """
    return [
        started(0, 1, world_size=8),
        ev("ready", 10),
        *steps(1, 1, [12, 14, 16, 18, 20]),
        ev("checkpoint_save_started", 20, step=5),
        ev("checkpoint_saved", 23, step=5, blocking_s=3.0),
        *steps(1, 6, [25, 27, 29]),
        fault(30),
        ended(35, 1, "failed"),
        started(50, 2, world_size=8),
        ev("ready", 55, 2),
        ev("checkpoint_load_started", 56, 2, step=5),
        ev("checkpoint_loaded", 60, 2, step=5),
        *steps(2, 6, [62, 64, 66, 68, 70]),
        ended(72, 2, "completed"),
        ev("job_finished", 73, 2),
    ]


CRASH_AND_RESTART = {
    # launch 1: steps 1..5 (kept: launch 2 restarts after step 5) 10 -> 20;
    # launch 2: steps 6..10, 60 -> 70
    "productive": 10 + 10,
    # 0 -> 10 and 50 -> 55
    "startup": 10 + 5,
    # load_started 56 -> loaded 60
    "checkpoint_restore": 4,
    # blocking_s 3 from save_started 20
    "checkpoint_save": 3,
    # steps 6..8 of launch 1, re-run by launch 2: (25 - 20 - 3) + 2 + 2
    "wasted_progress": 6,
    # last step 29 -> attempt_ended 35 (a crash being noticed)
    "stalled": 6,
    # attempt_ended 35 -> attempt_started 50
    "downtime": 15,
    # ready 55 -> load_started 56; completed launch's tail 70 -> 72; 72 -> job_finished 73
    "other": 1 + 2 + 1,
}


def test_crash_and_restart_from_the_last_checkpoint():
    led = ledger(crash_and_restart())
    # elapsed: first attempt_started 0 -> job_finished 73
    assert_ledger(led, 73, CRASH_AND_RESTART, world_size=8)
    assert led.slowdown_s == pytest.approx(0.0, abs=1e-9)  # every kept step took 2 s
    assert [launch.number for launch in led.launches] == [1, 2]


def test_a_hang_is_stalled_until_the_launch_is_killed():
    """4 GPUs; steps stop after step 6 and the launch is killed 300 s later.

    Launch 1: start 0, ready 5, steps 1..6 at 6..11, killed at 311.
    Launch 2 (no checkpoint: from scratch): start 321, ready 326, steps 1..8 at
    327..334, completed at 334; job_finished at 334.
    """
    events = [
        started(0, 1, world_size=4),
        ev("ready", 5),
        *steps(1, 1, [6, 7, 8, 9, 10, 11]),
        fault(311, "hang"),
        ended(311, 1, "killed"),
        started(321, 2, world_size=4),
        ev("ready", 326, 2),
        *steps(2, 1, [327, 328, 329, 330, 331, 332, 333, 334]),
        ended(334, 2, "completed"),
        ev("job_finished", 334, 2),
    ]
    expected = {
        "productive": 8,  # launch 2's steps 1..8, 326 -> 334
        "startup": 5 + 5,  # 0 -> 5, 321 -> 326
        "wasted_progress": 6,  # launch 1's steps 1..6 were all re-run: 5 -> 11
        "stalled": 300,  # last step 11 -> killed 311
        "downtime": 10,  # 311 -> 321
    }
    assert_ledger(ledger(events), 334, expected, world_size=4)


def test_a_rollback_to_an_older_checkpoint_wastes_the_steps_after_it():
    """2 GPUs; checkpoints of steps 4 and 8, a loss spike, a rollback to step 4.

    Launch 1: start 0, ready 2, steps 1..4 at 3..6, save of step 4 6 -> 7
    (blocking_s 1), steps 5..8 at 8..11, save of step 8 11 -> 12 (blocking_s 1),
    steps 9, 10 at 13, 14, killed at 15.
    Launch 2: start 20, ready 22, load 22 -> 25 of step 4 (not the latest, 8),
    steps 5..12 at 26..33, completed at 33; job_finished at 33.
    """
    events = [
        started(0, 1, world_size=2),
        ev("ready", 2),
        *steps(1, 1, [3, 4, 5, 6]),
        ev("checkpoint_save_started", 6, step=4),
        ev("checkpoint_saved", 7, step=4, blocking_s=1.0),
        *steps(1, 5, [8, 9, 10, 11]),
        ev("checkpoint_save_started", 11, step=8),
        ev("checkpoint_saved", 12, step=8, blocking_s=1.0),
        *steps(1, 9, [13, 14]),
        fault(14.5, "loss_spike"),
        ended(15, 1, "killed"),
        started(20, 2, world_size=2),
        ev("ready", 22, 2),
        ev("checkpoint_load_started", 22, 2, step=4),
        ev("checkpoint_loaded", 25, 2, step=4),
        *steps(2, 5, range(26, 34)),
        ended(33, 2, "completed"),
        ev("job_finished", 33, 2),
    ]
    expected = {
        "productive": 4 + 8,  # launch 1's steps 1..4 (2 -> 6); launch 2's 5..12 (25 -> 33)
        "startup": 2 + 2,  # 0 -> 2, 20 -> 22
        "checkpoint_restore": 3,  # 22 -> 25
        "checkpoint_save": 1 + 1,  # 6 -> 7, 11 -> 12
        # launch 1's steps 5..10, both those before the latest checkpoint (5..8)
        # and those after it (9, 10): (8 - 6 - 1) + 1 + 1 + 1 + (13 - 11 - 1) + 1
        "wasted_progress": 6,
        "stalled": 1,  # 14 -> 15
        "downtime": 5,  # 15 -> 20
    }
    led = ledger(events)
    assert_ledger(led, 33, expected, world_size=2)
    assert led.slowdown_s == pytest.approx(0.0, abs=1e-9)


def test_async_save_counts_only_its_blocking_and_takes_it_from_its_step():
    """1 GPU; an async save of step 4: started at 9, blocking 0.5 s, durable at 16.

    start 0, ready 1, steps 1..4 at 3, 5, 7, 9 (2 s each); the save blocks
    9 -> 9.5, so step 5 finishes at 11.5; steps 6..10 at 13.5 .. 21.5 while the
    save is written in the background (saved at 16, between steps 7 and 8);
    completed at 22; job_finished at 22.
    """
    events = [
        started(0),
        ev("ready", 1),
        *steps(1, 1, [3, 5, 7, 9]),
        ev("checkpoint_save_started", 9, step=4),
        *steps(1, 5, [11.5, 13.5, 15.5]),
        ev("checkpoint_saved", 16, step=4, blocking_s=0.5),
        *steps(1, 8, [17.5, 19.5, 21.5]),
        ended(22),
        ev("job_finished", 22),
    ]
    expected = {
        "productive": 20,  # 1 -> 21.5 less the 0.5 s blocking
        "startup": 1,  # 0 -> 1
        "checkpoint_save": 0.5,  # blocking_s, not started -> saved (7 s)
        "other": 0.5,  # completed launch's tail 21.5 -> 22
    }
    led = ledger(events)
    assert_ledger(led, 22, expected, world_size=1)
    # Step 5 took 11.5 - 9 - 0.5 = 2 s like every other step: no slowdown. Had
    # the blocking not been taken from it, it would show 0.5 s of slowdown.
    assert led.slowdown_s == pytest.approx(0.0, abs=1e-9)


def test_save_blocking_spanning_two_steps_is_taken_from_each_step_it_covers():
    """1 GPU; start 0, ready 1, steps 1..3 at 2, 3, 4.5; a save from 2.5 blocking 1 s.

    The blocking 2.5 -> 3.5 covers half of step 2 (2 -> 3) and half of step 3
    (3 -> 4.5): step 2 = 1 - 0.5 = 0.5 s, step 3 = 1.5 - 0.5 = 1 s.
    """
    events = [
        started(0),
        ev("ready", 1),
        ev("step", 2, step=1),
        ev("checkpoint_save_started", 2.5, step=1),
        ev("step", 3, step=2),
        ev("checkpoint_saved", 4, step=1, blocking_s=1.0),
        ev("step", 4.5, step=3),
        ended(4.5),
        ev("job_finished", 4.5),
    ]
    expected = {"productive": 1 + 0.5 + 1, "startup": 1, "checkpoint_save": 1}
    led = ledger(events)
    assert_ledger(led, 4.5, expected, world_size=1)
    # kept step times 1, 0.5, 1: median 1, nothing above it
    assert led.slowdown_s == pytest.approx(0.0, abs=1e-9)


def test_saves_without_blocking_s_and_without_save_started():
    """1 GPU; one save reported without blocking_s, one without save_started.

    start 0, ready 1, steps 1..3 at 2, 3, 4; save of step 3 started 4, saved 7
    with no blocking_s: blocked 4 -> 7; step 4 at 8, step 5 at 9; save of step
    5 reported only as saved at 11 with blocking_s 1.5: blocked 9.5 -> 11;
    step 6 at 11.5; completed at 12; job_finished at 12.
    """
    events = [
        started(0),
        ev("ready", 1),
        *steps(1, 1, [2, 3, 4]),
        ev("checkpoint_save_started", 4, step=3),
        ev("checkpoint_saved", 7, step=3),
        *steps(1, 4, [8, 9]),
        ev("checkpoint_saved", 11, step=5, blocking_s=1.5),
        ev("step", 11.5, step=6),
        ended(12),
        ev("job_finished", 12),
    ]
    expected = {
        # six steps of 1 s each: step 4 = 8 - 4 - 3, step 6 = 11.5 - 9 - 1.5
        "productive": 6,
        "startup": 1,
        "checkpoint_save": 3 + 1.5,  # start -> saved; saved - blocking_s -> saved
        "other": 0.5,  # 11.5 -> 12
    }
    led = ledger(events)
    assert_ledger(led, 12, expected, world_size=1)
    assert led.slowdown_s == pytest.approx(0.0, abs=1e-9)


def test_a_smaller_world_after_a_node_is_dropped():
    """8 GPUs, then 4 after a node is lost and no spare is left.

    Launch 1 (8 GPUs): start 0, ready 10, steps 1..10 at 11..20, a save of step
    10 reported only as saved at 22 with blocking_s 2 (blocked 20 -> 22), a
    fault at 25, failed at 30.
    Launch 2 (4 GPUs): start 60, ready 70, load 70 -> 75 of step 10, steps
    11..20 at 76..85, completed at 85; job_finished at 90.
    """
    events = [
        started(0, 1, world_size=8),
        ev("ready", 10),
        *steps(1, 1, range(11, 21)),
        ev("checkpoint_saved", 22, step=10, blocking_s=2.0),
        fault(25, "gpu_xid"),
        ended(30, 1, "failed"),
        started(60, 2, world_size=4),
        ev("ready", 70, 2),
        ev("checkpoint_load_started", 70, 2, step=10),
        ev("checkpoint_loaded", 75, 2, step=10),
        *steps(2, 11, range(76, 86)),
        ended(85, 2, "completed"),
        ev("job_finished", 90, 2),
    ]
    expected = {
        "productive": 10 + 10,  # 10 -> 20 and 75 -> 85
        "startup": 10 + 10,  # 0 -> 10 and 60 -> 70
        "checkpoint_restore": 5,  # 70 -> 75
        "checkpoint_save": 2,  # 20 -> 22
        "stalled": 8,  # last step 20 -> failed 30, less the 2 s save
        "downtime": 30,  # 30 -> 60
        "other": 5,  # 85 -> job_finished 90, after a completed launch
    }
    gpu = {
        "productive": 10 * 8 + 10 * 4,
        "startup": 10 * 8 + 10 * 4,
        "checkpoint_restore": 5 * 4,
        "checkpoint_save": 2 * 8,
        "stalled": 8 * 8,
        "downtime": 30 * 8,  # the gap is weighted by the launch before it (8 GPUs)
        "other": 5 * 4,  # after launch 2, weighted by it
    }
    led = ledger(events)
    assert_ledger(led, 90, expected, gpu=gpu)
    # 60 s at 8 GPUs, then 30 s at 4
    assert math.fsum(led.gpu_seconds.values()) == pytest.approx(60 * 8 + 30 * 4, abs=1e-6)
    assert led.gpu_goodput == pytest.approx(120 / 600, rel=1e-9)
    assert led.goodput == pytest.approx(20 / 90, rel=1e-9)


def test_a_running_job_runs_to_its_last_event_and_its_open_tail_is_stalled():
    """2 GPUs; no attempt_ended, no job_finished: the job's last event is a heartbeat at 12.

    start 0, ready 3, steps 1..5 at 4..8, heartbeat at 12.
    """
    events = [
        started(0, 1, world_size=2),
        ev("ready", 3),
        *steps(1, 1, [4, 5, 6, 7, 8]),
        heartbeat(12),
    ]
    expected = {"productive": 5, "startup": 3, "stalled": 4}  # 3 -> 8; 0 -> 3; 8 -> 12
    led = ledger(events)
    assert_ledger(led, 12, expected, world_size=2)
    assert led.as_of == pytest.approx(T0 + 12)


def test_a_running_job_between_launches_is_in_downtime():
    """1 GPU; launch 1 failed at 10; a fault report at 15 is the job's last event.

    start 0, ready 2, steps 1..4 at 3..6, failed at 10, fault at 15.
    """
    events = [
        started(0),
        ev("ready", 2),
        *steps(1, 1, [3, 4, 5, 6]),
        ended(10, 1, "failed"),
        fault(15, "ecc"),
    ]
    expected = {"productive": 4, "startup": 2, "stalled": 4, "downtime": 5}
    assert_ledger(ledger(events), 15, expected, world_size=1)


def test_no_ready_startup_runs_to_the_next_marker():
    """1 GPU; start 0, no ready, load 4 -> 6 of step 10, steps 11..13 at 7..9, completed 9."""
    events = [
        started(0),
        ev("checkpoint_load_started", 4, step=10),
        ev("checkpoint_loaded", 6, step=10),
        *steps(1, 11, [7, 8, 9]),
        ended(9),
        ev("job_finished", 9),
    ]
    # startup 0 -> load_started 4; restore 4 -> 6; steps from loaded 6 -> 9
    expected = {"startup": 4, "checkpoint_restore": 2, "productive": 3}
    assert_ledger(ledger(events), 9, expected, world_size=1)


def test_no_load_started_restore_runs_from_ready():
    """1 GPU; start 0, ready 2, loaded 5 (no load_started), steps at 6 and 7, completed 7."""
    events = [
        started(0),
        ev("ready", 2),
        ev("checkpoint_loaded", 5, step=3),
        *steps(1, 4, [6, 7]),
        ended(7),
        ev("job_finished", 7),
    ]
    expected = {"startup": 2, "checkpoint_restore": 3, "productive": 2}
    assert_ledger(ledger(events), 7, expected, world_size=1)


def test_time_between_ready_and_load_started_is_other():
    """1 GPU; start 0, ready 2, load 3 -> 5, steps at 6 and 7, completed 7.

    Ready -> load_started is neither startup (ends at ready) nor restore
    (starts at load_started): anything left is `other`.
    """
    events = [
        started(0),
        ev("ready", 2),
        ev("checkpoint_load_started", 3, step=3),
        ev("checkpoint_loaded", 5, step=3),
        *steps(1, 4, [6, 7]),
        ended(7),
        ev("job_finished", 7),
    ]
    expected = {"startup": 2, "other": 1, "checkpoint_restore": 2, "productive": 2}
    assert_ledger(ledger(events), 7, expected, world_size=1)


def test_no_ready_and_no_restore_the_first_step_runs_from_the_attempt_start():
    """1 GPU; start 0, no ready, no load: steps 1..3 at 5, 6, 7, completed 7.

    The step rule names the attempt's start as the training start when there is
    neither `checkpoint_loaded` nor `ready`, so step 1 is 0 -> 5 (the contract's
    "startup to the next marker" would claim the same 5 s; the step rule wins).
    """
    events = [started(0), *steps(1, 1, [5, 6, 7]), ended(7), ev("job_finished", 7)]
    led = ledger(events)
    assert_ledger(led, 7, {"productive": 7}, world_size=1)
    # kept step times 5, 1, 1: median 1, step 1 is 4 s above it
    assert led.slowdown_s == pytest.approx(4.0, abs=1e-9)


def test_a_launch_without_a_start_event_starts_at_its_first_event():
    """Launch 2 reports no attempt_started: it starts at its ready (40) and keeps launch 1's size.

    Launch 1 (4 GPUs): start 0, ready 1, steps 1..3 at 2..4, failed at 10.
    Launch 2: ready 40, loaded 42 (step 3, no load_started: from ready), steps
    4, 5 at 43, 44, completed 44; job_finished 44.
    """
    events = [
        started(0, 1, world_size=4),
        ev("ready", 1),
        *steps(1, 1, [2, 3, 4]),
        ended(10, 1, "failed"),
        ev("ready", 40, 2),
        ev("checkpoint_loaded", 42, 2, step=3),
        *steps(2, 4, [43, 44]),
        ended(44, 2),
        ev("job_finished", 44, 2),
    ]
    expected = {
        "productive": 3 + 2,
        "startup": 1,  # launch 2: start = ready, no startup
        "checkpoint_restore": 2,
        "stalled": 6,  # 4 -> 10
        "downtime": 30,  # 10 -> 40
    }
    assert_ledger(ledger(events), 44, expected, world_size=4)


@pytest.mark.parametrize(
    ("reason", "tail", "after"),
    [
        # completed: the tail after the last step and the last save, and the
        # time to job_finished, are `other`
        ("completed", "other", "other"),
        # failed: the tail is stalled, the time after the launch is downtime
        ("failed", "stalled", "downtime"),
    ],
)
def test_the_tail_of_a_launch(reason, tail, after):
    """1 GPU; start 0, ready 1, steps 1..4 at 2..5, save 5 -> 8 blocking 2 s, ended 10.

    job_finished at 12.
    """
    events = [
        started(0),
        ev("ready", 1),
        *steps(1, 1, [2, 3, 4, 5]),
        ev("checkpoint_save_started", 5, step=4),
        ev("checkpoint_saved", 8, step=4, blocking_s=2.0),
        ended(10, 1, reason),
        ev("job_finished", 12),
    ]
    expected = {"startup": 1, "productive": 4, "checkpoint_save": 2}
    expected[tail] = expected.get(tail, 0) + 3  # 7 -> 10: after the step (5) and the save (5 -> 7)
    expected[after] = expected.get(after, 0) + 2  # 10 -> 12
    assert_ledger(ledger(events), 12, expected, world_size=1)


def test_a_launch_that_never_trained_is_stalled_from_its_ready():
    """1 GPU; start 0, ready 3, failed at 8 with no step; a restart at 10 that completes.

    Launch 2: start 10, ready 11, steps 1, 2 at 12, 13, completed 13; job_finished 13.
    """
    events = [
        started(0),
        ev("ready", 3),
        ended(8, 1, "failed"),
        started(10, 2),
        ev("ready", 11, 2),
        *steps(2, 1, [12, 13]),
        ended(13, 2),
        ev("job_finished", 13, 2),
    ]
    expected = {
        "startup": 3 + 1,  # 0 -> 3, 10 -> 11
        "stalled": 5,  # no step: from the training start (ready 3) to the end (8)
        "downtime": 2,  # 8 -> 10
        "productive": 2,  # 11 -> 13
    }
    assert_ledger(ledger(events), 13, expected, world_size=1)


# A save or a restore that never finished fits none of the contract's forms;
# in a launch that ended, that time is a hang (stalled); while the launch
# still runs, it is the save or restore in flight.


def test_a_hang_inside_a_save_that_never_became_durable_is_stalled():
    """1 GPU; start 0, ready 1, steps 1..4 at 2..5, a save of step 4 started at 5
    that never finishes; killed at 605; job_finished 605.
    """
    events = [
        started(0),
        ev("ready", 1),
        *steps(1, 1, [2, 3, 4, 5]),
        ev("checkpoint_save_started", 5, step=4),
        fault(605, "hang"),
        ended(605, 1, "killed"),
        ev("job_finished", 605),
    ]
    # startup 0 -> 1, steps 1 -> 5, stalled 5 -> 605: no save blocking is
    # defined for a save with only a start
    expected = {"startup": 1, "productive": 4, "stalled": 600}
    assert_ledger(ledger(events), 605, expected, world_size=1)


def test_a_hang_while_restoring_is_stalled():
    """1 GPU; start 0, ready 2, checkpoint_load_started 3, never loaded, killed at 303.

    job_finished 303.
    """
    events = [
        started(0),
        ev("ready", 2),
        ev("checkpoint_load_started", 3, step=100),
        fault(303, "hang"),
        ended(303, 1, "killed"),
        ev("job_finished", 303),
    ]
    # startup 0 -> 2; no step and nothing loaded, so the training start is
    # ready (2) and the launch is stalled 2 -> 303
    expected = {"startup": 2, "stalled": 301}
    assert_ledger(ledger(events), 303, expected, world_size=1)


def test_a_save_in_flight_in_a_running_job_is_checkpoint_save():
    """1 GPU; start 0, ready 1, steps 1..4 at 2..5, a save of step 4 started at 5,
    a heartbeat at 9: the job runs, the save is in flight."""
    events = [
        started(0),
        ev("ready", 1),
        *steps(1, 1, [2, 3, 4, 5]),
        ev("checkpoint_save_started", 5, step=4),
        heartbeat(9),
    ]
    expected = {"startup": 1, "productive": 4, "checkpoint_save": 4}
    assert_ledger(ledger(events), 9, expected, world_size=1)


def test_a_restore_in_flight_in_a_running_job_is_checkpoint_restore():
    """1 GPU; start 0, ready 2, checkpoint_load_started 3, a heartbeat at 10."""
    events = [
        started(0),
        ev("ready", 2),
        ev("checkpoint_load_started", 3, step=100),
        heartbeat(10),
    ]
    # startup 0 -> 2; training starts at ready (nothing loaded yet), so 2 -> 3
    # is the open tail (stalled); restore 3 -> 10
    expected = {"startup": 2, "stalled": 1, "checkpoint_restore": 7}
    assert_ledger(ledger(events), 10, expected, world_size=1)


# --- windows --------------------------------------------------------------------


def test_window_clips_the_ledger():
    """The crash-and-restart trace over [15, 50].

    Launch 1 inside [15, 35]: steps 3 (half), 4, 5: 15 -> 20 productive; save
    20 -> 23; steps 6..8: 23 -> 29 wasted; 29 -> 35 stalled. Then 35 -> 50 downtime.
    """
    led = ledger(crash_and_restart(), start=15, end=50)
    expected = {
        "productive": 5,
        "checkpoint_save": 3,
        "wasted_progress": 6,
        "stalled": 6,
        "downtime": 15,
    }
    assert_ledger(led, 35, expected, world_size=8)
    assert led.start == pytest.approx(T0 + 15)
    assert led.end == pytest.approx(T0 + 50)


def test_window_over_the_whole_job_is_the_cumulative_ledger():
    events = crash_and_restart()
    whole = ledger(events)
    for start, end in [(0, 73), (-100, 1000), (None, 73), (0, None)]:
        led = ledger(events, start=start, end=end)
        assert_ledger(led, 73, CRASH_AND_RESTART, world_size=8)
        assert led.slowdown_s == pytest.approx(whole.slowdown_s, abs=1e-9)


@pytest.mark.parametrize(
    "cuts",
    [
        [0, 73],
        [0, 36.5, 73],
        [0, 7.3, 15, 21.25, 24, 35, 50, 55.5, 58, 61, 73],
        [-10, 11, 20, 23, 29, 35, 60, 70, 72, 80],
    ],
)
def test_windows_that_tile_the_job_add_up_to_the_cumulative_ledger(cuts):
    events = crash_and_restart()
    whole = ledger(events)
    parts = [ledger(events, start=a, end=b) for a, b in itertools.pairwise(cuts)]
    for part in parts:
        assert_partition(part)
    cats, gpu = add(*parts)
    assert cats == {name: pytest.approx(whole.categories[name], abs=1e-6) for name in CATEGORIES}
    assert gpu == {name: pytest.approx(whole.gpu_seconds[name], abs=1e-6) for name in CATEGORIES}
    assert math.fsum(p.elapsed_s for p in parts) == pytest.approx(whole.elapsed_s, abs=1e-6)


@pytest.mark.parametrize(("start", "end"), [(100, 200), (-200, -100), (73, 1000), (-50, 0)])
def test_a_window_outside_the_job_is_empty(start, end):
    led = ledger(crash_and_restart(), start=start, end=end)
    assert led.elapsed_s == 0
    assert led.categories == dict.fromkeys(CATEGORIES, 0.0)
    assert led.gpu_seconds == dict.fromkeys(CATEGORIES, 0.0)
    assert led.goodput is None
    assert led.slowdown_s == 0


# --- slowdown ---------------------------------------------------------------------


def slow_steps():
    """1 GPU; kept step times 1, 1, 1, 1, 4, 1, 1, 2.5, 1, 1 and (re-run) 1.

    Launch 1: start 0, ready 1, steps 1..10 at 2, 3, 4, 5, 9, 10, 11, 13.5,
    14.5, 15.5, step 11 at 20.5 (5 s, slow, but thrown away), failed at 21.
    Launch 2: start 25, ready 26, load 26 -> 27 of step 10, step 11 at 28,
    completed 28; job_finished 28.
    """
    return [
        started(0),
        ev("ready", 1),
        *steps(1, 1, [2, 3, 4, 5, 9, 10, 11, 13.5, 14.5, 15.5, 20.5]),
        ended(21, 1, "failed"),
        started(25, 2),
        ev("ready", 26, 2),
        ev("checkpoint_load_started", 26, 2, step=10),
        ev("checkpoint_loaded", 27, 2, step=10),
        ev("step", 28, 2, step=11),
        ended(28, 2),
        ev("job_finished", 28, 2),
    ]


def test_slowdown_is_the_excess_of_slow_productive_steps_over_the_median():
    led = ledger(slow_steps())
    expected = {
        "productive": 14.5 + 1,  # 1 -> 15.5, 27 -> 28
        "startup": 1 + 1,
        "checkpoint_restore": 1,
        "wasted_progress": 5,  # step 11 of launch 1, 15.5 -> 20.5
        "stalled": 0.5,  # 20.5 -> 21
        "downtime": 4,  # 21 -> 25
    }
    assert_ledger(led, 28, expected, world_size=1)
    # median of the 11 kept step times is 1; (4 - 1) + (2.5 - 1); the wasted
    # 5 s step does not count
    assert led.slowdown_s == pytest.approx(4.5, abs=1e-9)


def test_slowdown_of_a_window_counts_the_steps_that_end_inside_it():
    events = slow_steps()
    assert ledger(events, end=12).slowdown_s == pytest.approx(3.0, abs=1e-9)  # step 5
    assert ledger(events, start=12).slowdown_s == pytest.approx(1.5, abs=1e-9)  # step 8


# --- through the API ----------------------------------------------------------------


def to_wire(events, job):
    """The events as wire format v1 would carry them."""
    out = []
    for i, e in enumerate(events):
        wire = {"id": f"e{i}", "job": job, "kind": e["kind"], "ts": e["ts"], "data": e["data"]}
        if e["attempt"] is not None:
            wire["attempt"] = e["attempt"]
        if e["kind"] == "heartbeat":
            wire["node"] = "gpu-node-000"
        out.append(wire)
    return out


def assert_same_figures(got, led):
    want = led.as_dict()
    assert got["job"] == want["job"]
    assert got["elapsed_s"] == pytest.approx(want["elapsed_s"], abs=1e-6)
    for name in CATEGORIES:
        assert got["categories"][name] == pytest.approx(want["categories"][name], abs=1e-6)
        assert got["gpu_seconds"][name] == pytest.approx(want["gpu_seconds"][name], abs=1e-5)
    for name in ("goodput", "gpu_goodput"):
        if want[name] is None:
            assert got[name] is None
        else:
            assert got[name] == pytest.approx(want[name], rel=1e-9)
    assert got["slowdown_s"] == pytest.approx(want["slowdown_s"], abs=1e-6)


@pytest.mark.django_db
def test_the_goodput_api_gives_the_ledger_of_the_ingested_trace(ingest, personas):
    key = "acct-crash-restart"
    events = crash_and_restart()
    wire = to_wire(events, key)
    # out of order, as events may arrive
    r = ingest(wire[::-1])
    assert r.status_code == 202, r.content
    assert r.json() == {"accepted": len(wire), "duplicates": 0}

    lifecycle, st, last = build(events)
    client = personas["viewer"].client()

    r = client.get(f"/api/v1/jobs/{key}/goodput")
    assert r.status_code == 200, r.content
    body = r.json()
    assert set(body["categories"]) == set(CATEGORIES)
    assert set(body["gpu_seconds"]) == set(CATEGORIES)
    whole = compute_ledger(key, lifecycle, st, last_event_ts=last)
    assert_same_figures(body, whole)
    # and the hand-worked figures
    for name in CATEGORIES:
        assert body["categories"][name] == pytest.approx(CRASH_AND_RESTART.get(name, 0), abs=1e-6)
    assert body["elapsed_s"] == pytest.approx(73, abs=1e-6)

    windows = [(15, 50), (0, 36.5), (36.5, 73), (100, 200)]
    parts = {}
    for a, b in windows:
        r = client.get(f"/api/v1/jobs/{key}/goodput", {"start": T0 + a, "end": T0 + b})
        assert r.status_code == 200, r.content
        led = compute_ledger(key, lifecycle, st, last_event_ts=last, start=T0 + a, end=T0 + b)
        assert_same_figures(r.json(), led)
        parts[a, b] = r.json()
    # the two halves add up to the whole
    for name in CATEGORIES:
        halves = parts[0, 36.5]["categories"][name] + parts[36.5, 73]["categories"][name]
        assert halves == pytest.approx(body["categories"][name], abs=1e-6)
    assert parts[100, 200]["elapsed_s"] == 0
