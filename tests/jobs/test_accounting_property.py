"""Goodput accounting over generated event streams (hypothesis).

A generator plays a job: 1..5 launches of random world sizes, steps of random
length, saves (blocking or async, with or without `blocking_s` and
`checkpoint_save_started`), restarts from a random earlier checkpoint (older
ones too: rollbacks), missing `ready` and `checkpoint_load_started` markers,
random gaps, a last launch that may still be running, an optional
`job_finished`. Every event of such a stream lies inside its launch.

The properties: the categories partition the elapsed time (and the GPU-seconds
the per-launch-weighted total); productive and wasted progress, and where the
contract leaves no doubt every category, equal a plain-Python reading of the
contract written here; arrival order does not matter; a window cut in two adds
up to the whole. A noisy variant adds stray events anywhere (late reports,
duplicated markers) and checks the invariants that hold for any stream.
"""

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.accounting import CATEGORIES
from tests.jobs.traces import ledger_of

T0 = 1_700_000_000.0
SETTINGS = settings(  # the count of examples: the profile's (tests/conftest.py)
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def at(ms: int) -> float:
    return T0 + ms / 1000


# --- the stream -------------------------------------------------------------------


ledger = ledger_of


@dataclass
class LaunchInfo:
    number: int
    start: float
    world_size: int
    end: float | None  # attempt_ended, if reported
    reason: str


@dataclass
class Trace:
    events: list[dict]
    launches: list[LaunchInfo]
    t_end: float  # job_finished, or the last event
    cut: float  # a point to cut windows at


def chance(draw, percent):
    return draw(st.integers(0, 99)) < percent


@st.composite
def traces(draw):
    events: list[dict] = []

    def emit(kind, ms, attempt, **data):
        events.append({"kind": kind, "ts": at(ms), "attempt": attempt, "data": data})

    now = 0
    checkpoints: list[int] = []  # durable steps
    launches: list[LaunchInfo] = []
    n = draw(st.integers(1, 5))
    for number in range(1, n + 1):
        last_launch = number == n
        ws = draw(st.sampled_from([1, 2, 4, 8, 16, 64]))
        launch = LaunchInfo(number, at(now), ws, None, "")
        launches.append(launch)
        emit("attempt_started", now, number, world_size=ws, gpus_per_node=min(ws, 8))
        now += draw(st.integers(0, 20_000))
        if chance(draw, 80):
            emit("ready", now, number)

        # restore: a random earlier checkpoint (older ones too), or from scratch
        step = 0
        if (checkpoints and chance(draw, 85)) or (number == 1 and chance(draw, 15)):
            step = draw(st.sampled_from(checkpoints)) if checkpoints else 0
            if chance(draw, 70):
                emit("checkpoint_load_started", now, number, step=step)
                now += draw(st.integers(0, 15_000))
            emit("checkpoint_loaded", now, number, step=step)

        pending = []  # async saves not yet durable: (due after step i, step, blocking, has_b)

        def durable(save_step, b, has_b, ms, number=number):
            data = {"step": save_step}
            if has_b:
                data["blocking_s"] = b / 1000
            emit("checkpoint_saved", ms, number, **data)
            checkpoints.append(save_step)

        for i in range(draw(st.integers(0, 12))):
            compute = draw(st.integers(0, 3_000) | st.integers(3_000, 20_000))
            for p in [p for p in pending if p[0] <= i]:
                pending.remove(p)
                durable(*p[1:], now + draw(st.integers(0, compute)))
            now += compute
            step += 1
            emit("step", now, number, step=step)
            if chance(draw, 30):  # a save of this step
                has_started, has_b = draw(st.booleans()), draw(st.booleans())
                is_async = chance(draw, 40)
                b = draw(st.integers(0, 500 if is_async else 3_000))
                if has_started:
                    emit("checkpoint_save_started", now, number, step=step)
                now += b  # training blocked
                if is_async:
                    pending.append((i + draw(st.integers(1, 3)), step, b, has_b))
                else:
                    durable(step, b, has_b, now)

        tail = draw(st.integers(0, 30_000))
        for p in pending:  # still in flight: durable in the tail
            durable(*p[1:], now + draw(st.integers(0, tail)))
        if chance(draw, 30):
            fault_at = now + draw(st.integers(0, tail))
            events.append(
                {"kind": "fault", "ts": at(fault_at), "attempt": None, "data": {"type": "crash"}}
            )
        now += tail

        if not last_launch:
            if chance(draw, 85):
                launch.reason = draw(
                    st.sampled_from(["failed", "killed", "preempted", "failed", "completed"])
                )
                launch.end = at(now)
                emit("attempt_ended", now, number, reason=launch.reason)
            now += draw(st.just(0) | st.integers(0, 60_000))
        else:
            if chance(draw, 70):  # else still running
                launch.reason = "completed" if chance(draw, 70) else "failed"
                launch.end = at(now)
                emit("attempt_ended", now, number, reason=launch.reason)
            extra = draw(st.integers(0, 20_000))
            if chance(draw, 50):
                emit("job_finished", now + extra, number)
            elif chance(draw, 50):
                events.append(
                    {
                        "kind": "heartbeat",
                        "ts": at(now + extra),
                        "attempt": None,
                        "data": {},
                    }
                )

    finished = [e["ts"] for e in events if e["kind"] == "job_finished"]
    t_end = finished[0] if finished else max(e["ts"] for e in events)
    span = round((t_end - T0) * 1000)
    if chance(draw, 40):
        cut = draw(st.sampled_from([e["ts"] for e in events]))
    else:
        cut = at(draw(st.integers(-5_000, span + 5_000)))
    return Trace(events, launches, t_end, cut)


@st.composite
def noisy_traces(draw):
    """A trace plus stray events anywhere: late or early reports, duplicated markers."""
    trace = draw(traces())
    n = len(trace.launches)
    span = round((trace.t_end - T0) * 1000)
    events = list(trace.events)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(
            st.sampled_from(
                [
                    "step",
                    "step",
                    "ready",
                    "checkpoint_load_started",
                    "checkpoint_loaded",
                    "checkpoint_save_started",
                    "checkpoint_saved",
                    "attempt_ended",
                    "attempt_started",
                    "job_finished",
                ]
            )
        )
        data = {}
        if kind in ("step", "checkpoint_load_started", "checkpoint_loaded"):
            data["step"] = draw(st.integers(0, 30))
        elif kind in ("checkpoint_save_started", "checkpoint_saved"):
            data["step"] = draw(st.integers(0, 30))
            if kind == "checkpoint_saved" and draw(st.booleans()):
                data["blocking_s"] = draw(st.integers(0, 5_000)) / 1000
        elif kind == "attempt_ended":
            data["reason"] = draw(st.sampled_from(["completed", "failed", "killed"]))
        elif kind == "attempt_started":
            data["world_size"] = draw(st.sampled_from([1, 4, 8]))
        ms = draw(st.integers(-10_000, span + 10_000))
        attempt = draw(st.integers(1, n + 1))
        pos = draw(st.integers(0, len(events)))
        events.insert(pos, {"kind": kind, "ts": at(ms), "attempt": attempt, "data": data})
    cut = at(draw(st.integers(-10_000, span + 20_000)))
    return events, cut


# --- a plain reading of the contract ----------------------------------------------


def merge(intervals):
    out = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def overlap(a, b, merged):
    return sum(max(0.0, min(b, v) - max(a, u)) for u, v in merged)


def contract_blocking(evs):
    """Save blocking of one launch, merged: the contract's rule per save."""
    saves = defaultdict(dict)
    for e in evs:
        if e["kind"] == "checkpoint_save_started":
            saves[e["data"]["step"]].setdefault("started", e["ts"])
        elif e["kind"] == "checkpoint_saved":
            saves[e["data"]["step"]].setdefault("saved", e["ts"])
            saves[e["data"]["step"]].setdefault("b", e["data"].get("blocking_s"))
    intervals = []
    for s in saves.values():
        started, saved, b = s.get("started"), s.get("saved"), s.get("b")
        if b is not None and started is not None:
            intervals.append((started, started + b))  # blocking_s from save_started
        elif b is not None:
            intervals.append((saved - b, saved))  # ending at checkpoint_saved
        elif started is not None and saved is not None:
            intervals.append((started, saved))  # without blocking_s: start -> saved
    return merge(intervals)


def first(evs, kind):
    return next((e["ts"] for e in evs if e["kind"] == kind), None)


def per_attempt(events):
    by = defaultdict(list)
    for i, e in enumerate(events):
        if e["attempt"] is not None:
            by[e["attempt"]].append((e["ts"], i, e))
    return {a: [e for _, _, e in sorted(v, key=lambda x: x[:2])] for a, v in by.items()}


def contract_steps(trace):
    """Each step execution: (step, ts, arrival, attempt, seconds, kept).

    Step k's time runs from the previous step of its launch (or the training
    start: checkpoint_loaded, else ready, else attempt_started) to its event,
    less save blocking inside; an execution is kept when it is the last one of
    its step number in the job (by ts, then arrival).
    """
    executions = []
    arrival = {id(e): i for i, e in enumerate(trace.events)}
    for evs in per_attempt(trace.events).values():
        prev = (
            first(evs, "checkpoint_loaded") or first(evs, "ready") or first(evs, "attempt_started")
        )
        blocking = contract_blocking(evs)
        for e in evs:
            if e["kind"] == "step":
                secs = e["ts"] - prev - overlap(prev, e["ts"], blocking)
                executions.append([e["data"]["step"], e["ts"], arrival[id(e)], e["attempt"], secs])
                prev = e["ts"]
    last = {}
    for ex in sorted(executions, key=lambda x: (x[1], x[2])):
        last[ex[0]] = ex
    return [(*ex, last[ex[0]] is ex) for ex in executions]


def contract_ledger(trace):
    """The eight categories (seconds and GPU-seconds) read off the contract, or None.

    None when a launch falls where the contract reads two ways: no `ready` and
    no `checkpoint_load_started` (startup "to the next marker" against the
    first step's interval from the attempt's start), or a `checkpoint_loaded`
    with neither before it.
    """
    cats = dict.fromkeys(CATEGORIES, 0.0)
    gpu = dict.fromkeys(CATEGORIES, 0.0)
    by = per_attempt(trace.events)
    steps = contract_steps(trace)
    for k, launch in enumerate(trace.launches):
        evs = by[launch.number]
        ready, load_started = first(evs, "ready"), first(evs, "checkpoint_load_started")
        loaded = first(evs, "checkpoint_loaded")
        if ready is None and load_started is None:
            return None
        nxt = trace.launches[k + 1].start if k + 1 < len(trace.launches) else None
        stop = launch.end if launch.end is not None else (nxt if nxt is not None else trace.t_end)
        c = dict.fromkeys(CATEGORIES, 0.0)
        c["startup"] = (ready if ready is not None else load_started) - launch.start
        if loaded is not None:
            c["checkpoint_restore"] = loaded - (load_started if load_started is not None else ready)
            if ready is not None and load_started is not None:
                c["other"] += load_started - ready  # neither startup nor restore
        blocking = contract_blocking(evs)
        c["checkpoint_save"] = sum(v - u for u, v in blocking)
        mine = [ex for ex in steps if ex[3] == launch.number]
        c["productive"] = sum(ex[4] for ex in mine if ex[5])
        c["wasted_progress"] = sum(ex[4] for ex in mine if not ex[5])
        train_start = loaded if loaded is not None else ready
        tail_from = max([train_start] + [ex[1] for ex in mine])
        tail = stop - tail_from - overlap(tail_from, stop, blocking)
        c["other" if launch.reason == "completed" else "stalled"] += tail
        gap = (nxt if nxt is not None else trace.t_end) - stop
        after = "other" if nxt is None and launch.reason == "completed" else "downtime"
        c[after] += gap
        for name in CATEGORIES:
            cats[name] += c[name]
            gpu[name] += c[name] * launch.world_size
    return cats, gpu


def weighted_total(trace):
    """GPU-seconds of the whole job: each launch's size from its start to the next start."""
    total = 0.0
    for k, launch in enumerate(trace.launches):
        nxt = trace.launches[k + 1].start if k + 1 < len(trace.launches) else trace.t_end
        total += (nxt - launch.start) * launch.world_size
    return total


def tie_keeping_shuffle(events, rnd):
    """Events in a random arrival order; events with equal ts keep their relative order."""
    perm = list(range(len(events)))
    rnd.shuffle(perm)
    positions = defaultdict(list)
    for pos, i in enumerate(perm):
        positions[events[i]["ts"]].append(pos)
    out = [None] * len(events)
    for group in positions.values():
        originals = sorted(perm[p] for p in group)
        for p, i in zip(group, originals, strict=True):
            out[p] = events[i]
    return out


# --- checks -----------------------------------------------------------------------


def assert_partition(led):
    for name in CATEGORIES:
        assert led.categories[name] >= -1e-9, (name, led.categories)
        assert led.gpu_seconds[name] >= -1e-9, (name, led.gpu_seconds)
    assert math.fsum(led.categories.values()) == pytest.approx(led.elapsed_s, abs=1e-6)


def assert_close(got: dict, want: dict, tol=1e-6):
    assert got == {name: pytest.approx(want[name], abs=tol) for name in CATEGORIES}


def assert_windows_add_up(events, cut):
    whole = ledger(events)
    before, after = ledger(events, end=cut), ledger(events, start=cut)
    for part in (before, after):
        assert_partition(part)
    assert before.elapsed_s + after.elapsed_s == pytest.approx(whole.elapsed_s, abs=1e-6)
    both = {n: before.categories[n] + after.categories[n] for n in CATEGORIES}
    assert_close(both, whole.categories)
    both_gpu = {n: before.gpu_seconds[n] + after.gpu_seconds[n] for n in CATEGORIES}
    assert_close(both_gpu, whole.gpu_seconds, tol=1e-4)
    assert before.slowdown_s + after.slowdown_s == pytest.approx(whole.slowdown_s, abs=1e-6)


def figures(led):
    return (led.elapsed_s, led.categories, led.gpu_seconds, led.slowdown_s, led.goodput)


# --- properties -------------------------------------------------------------------


@SETTINGS
@given(traces())
def test_categories_partition_the_elapsed_time_and_the_gpu_seconds(trace):
    led = ledger(trace.events)
    assert_partition(led)
    assert led.elapsed_s == pytest.approx(trace.t_end - trace.launches[0].start, abs=1e-6)
    assert math.fsum(led.gpu_seconds.values()) == pytest.approx(weighted_total(trace), abs=1e-4)
    assert [launch.number for launch in led.launches] == [x.number for x in trace.launches]


@SETTINGS
@given(traces())
def test_productive_and_wasted_progress_follow_the_step_rules(trace):
    led = ledger(trace.events)
    steps = contract_steps(trace)
    ws = {launch.number: launch.world_size for launch in trace.launches}
    productive = sum(ex[4] for ex in steps if ex[5])
    wasted = sum(ex[4] for ex in steps if not ex[5])
    assert led.categories["productive"] == pytest.approx(productive, abs=1e-6)
    assert led.categories["wasted_progress"] == pytest.approx(wasted, abs=1e-6)
    gpu_productive = sum(ex[4] * ws[ex[3]] for ex in steps if ex[5])
    gpu_wasted = sum(ex[4] * ws[ex[3]] for ex in steps if not ex[5])
    assert led.gpu_seconds["productive"] == pytest.approx(gpu_productive, abs=1e-4)
    assert led.gpu_seconds["wasted_progress"] == pytest.approx(gpu_wasted, abs=1e-4)
    kept = [ex[4] for ex in steps if ex[5]]
    if kept:
        median = statistics.median(kept)
        slowdown = sum(max(0.0, d - median) for d in kept)
        assert led.slowdown_s == pytest.approx(slowdown, abs=1e-6)
    else:
        assert led.slowdown_s == 0


@SETTINGS
@given(traces())
def test_every_category_follows_the_contract_where_it_reads_one_way(trace):
    want = contract_ledger(trace)
    if want is None:
        return
    cats, gpu = want
    led = ledger(trace.events)
    assert_close(led.categories, cats)
    assert_close(led.gpu_seconds, gpu, tol=1e-4)


@SETTINGS
@given(traces(), st.randoms(use_true_random=False))
def test_arrival_order_does_not_matter(trace, rnd):
    shuffled = tie_keeping_shuffle(trace.events, rnd)
    assert figures(ledger(shuffled)) == figures(ledger(trace.events))


@SETTINGS
@given(traces())
def test_a_window_cut_in_two_adds_up_to_the_whole(trace):
    assert_windows_add_up(trace.events, trace.cut)


@SETTINGS
@given(noisy_traces(), st.randoms(use_true_random=False))
def test_invariants_hold_for_any_stream(noisy, rnd):
    events, cut = noisy
    led = ledger(events)
    assert_partition(led)
    # GPU-seconds: each launch's time and the gap after it, at its size, up to the job's end
    total = sum(
        max(0.0, min(launch.stop + launch.gap_after_s, led.end) - launch.start) * launch.world_size
        for launch in led.launches
    )
    assert math.fsum(led.gpu_seconds.values()) == pytest.approx(total, abs=1e-4)
    shuffled = tie_keeping_shuffle(events, rnd)
    assert figures(ledger(shuffled)) == figures(led)
    assert_windows_add_up(events, cut)


def test_the_reference_reads_a_small_trace_as_worked_by_hand():
    """The reference itself, on a trace worked by hand (a check of the checker).

    Launch 1 (2 GPUs): start 0, ready 1, steps 1, 2 at 2, 4 with a save of step
    1 started at 2 blocking 0.5 s, failed at 5. Launch 2 (1 GPU): start 6,
    ready 7, loaded 8 (step 1, from ready), step 2 at 9, completed 9.
    """

    def e(kind, t, attempt, **data):
        return {"kind": kind, "ts": T0 + t, "attempt": attempt, "data": data}

    events = [
        e("attempt_started", 0, 1, world_size=2),
        e("ready", 1, 1),
        e("step", 2, 1, step=1),
        e("checkpoint_save_started", 2, 1, step=1),
        e("checkpoint_saved", 3, 1, step=1, blocking_s=0.5),
        e("step", 4, 1, step=2),
        e("attempt_ended", 5, 1, reason="failed"),
        e("attempt_started", 6, 2, world_size=1),
        e("ready", 7, 2),
        e("checkpoint_loaded", 8, 2, step=1),
        e("step", 9, 2, step=2),
        e("attempt_ended", 9, 2, reason="completed"),
    ]
    trace = Trace(
        events,
        [LaunchInfo(1, T0, 2, T0 + 5, "failed"), LaunchInfo(2, T0 + 6, 1, T0 + 9, "completed")],
        T0 + 9,
        T0 + 4,
    )
    steps = contract_steps(trace)
    assert [(ex[0], ex[3], ex[4], ex[5]) for ex in steps] == [
        (1, 1, 1.0, True),
        (2, 1, 1.5, False),  # 2 -> 4 less 0.5 s of blocking
        (2, 2, 1.0, True),
    ]
    cats, gpu = contract_ledger(trace)
    assert cats == {
        "productive": 2.0,
        "startup": 2.0,
        "checkpoint_restore": 1.0,
        "checkpoint_save": 0.5,
        "wasted_progress": 1.5,
        "stalled": 1.0,
        "downtime": 1.0,
        "other": 0.0,
    }
    assert gpu["downtime"] == 2.0  # weighted by launch 1
    assert weighted_total(trace) == 6 * 2 + 3 * 1
    assert_close(ledger(events).categories, cats)
