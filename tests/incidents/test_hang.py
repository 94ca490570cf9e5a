"""The hang detector: no step for longer than the learned timeout, on the job's clock.

And its false-positive side: jitter, a pause below the timeout, a slow checkpoint save."""

import random

import pytest

from incidents.models import DetectorSetting, Incident
from jobs.models import TrainingJob
from tests.incidents.conftest import detect

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0
_n = iter(range(1, 10**6))


def ev(kind, ts, attempt=1, node=None, **data):
    e = {"id": f"e{next(_n)}", "job": "j1", "kind": kind, "ts": T0 + ts, "data": data}
    if attempt is not None:
        e["attempt"] = attempt
    if node is not None:
        e["node"] = node
    return e


def start(t=0.0, attempt=1, nodes=("n0", "n1")):
    return [
        ev("attempt_started", t, attempt, world_size=8, nodes=list(nodes)),
        ev("ready", t + 10, attempt),
    ]


def steps(times, attempt=1, first=1):
    return [ev("step", t, attempt, step=first + i) for i, t in enumerate(times)]


def heartbeats(t0, t1, node="n0", every=5.0):
    out, t = [], t0
    while t <= t1:
        out.append(ev("heartbeat", t, None, node=node))
        t += every
    return out


def hangs(ingest, events):
    for i in range(0, len(events), 500):
        assert ingest(events[i : i + 500]).status_code == 202
    return [i for i in detect("j1") if i.fault_type == "hang"]


def test_a_running_launch_that_stops_stepping_is_a_hang(ingest):
    times = [11 + i for i in range(20)]  # steps 1..20 at 11..30
    [hang] = hangs(ingest, start() + steps(times) + heartbeats(31, 200))
    assert hang.cause == Incident.Cause.HANG
    assert hang.fault_at.timestamp() == pytest.approx(T0 + 30)  # the last progress
    assert hang.detected_at.timestamp() == pytest.approx(T0 + 90)  # + the 60 s floor
    assert hang.time_to_detect_s == pytest.approx(60)
    assert "after step 20" in hang.summary


def test_jitter_and_a_pause_below_the_timeout_are_not_hangs(ingest):
    rng = random.Random(1)
    t, times = 11.0, []
    for i in range(200):
        t += rng.uniform(0.7, 1.3) + (45 if i == 100 else 0)  # one 45 s pause (an eval)
        times.append(t)
    assert hangs(ingest, start() + steps(times) + heartbeats(t, t + 30)) == []


def test_an_announced_evaluation_pause_is_not_a_hang_and_not_learned(ingest):
    """Steps every second, then a 4-minute evaluation the loop announced: unannounced it
    is a hang (the 60 s floor); announced it is neither a hang nor learned from, so a
    real stall after it is still found at the floor, not at 5 x 4 minutes."""
    times = [11 + i for i in range(20)]  # steps 1..20 at 11..30
    times += [271 + i for i in range(20)]  # after the evaluation, 30..270: steps 21..40
    events = start() + steps(times)
    events += [ev("pause_started", 30.5, reason="evaluation"), ev("pause_ended", 270.5)]
    events += heartbeats(291, 400)  # and then a real stall after step 40, at 290
    [hang] = hangs(ingest, events)
    assert hang.fault_at.timestamp() == pytest.approx(T0 + 290)
    assert hang.detected_at.timestamp() == pytest.approx(T0 + 350)  # the 60 s floor


def test_an_open_pause_holds_off_the_hang_until_its_limit(ingest):
    """A pause that never ends (a hang inside the evaluation) counts from
    hang.pause_max_s on: the hang is found at its limit + the timeout."""
    times = [11 + i for i in range(20)]
    events = start() + steps(times) + [ev("pause_started", 30.0, reason="evaluation")]
    events += heartbeats(31, 500)
    assert hangs(ingest, events) == []  # 470 s paused: within the default 2 hours
    job = TrainingJob.objects.get(key="j1")
    DetectorSetting.objects.create(job=job, name="hang.pause_max_s", value=300)
    [hang] = detect_hangs()
    assert hang.fault_at.timestamp() == pytest.approx(T0 + 30)
    assert hang.detected_at.timestamp() == pytest.approx(T0 + 30 + 300 + 60)


def test_unannounced_the_same_evaluation_is_a_hang(ingest):
    times = [11 + i for i in range(20)] + [271 + i for i in range(20)]
    [hang] = hangs(ingest, start() + steps(times) + heartbeats(271, 300))
    assert hang.fault_at.timestamp() == pytest.approx(T0 + 30)


def test_a_slow_checkpoint_save_is_not_a_hang(ingest):
    times = [11 + i for i in range(20)] + [331 + i for i in range(10)]
    events = start() + steps(times)
    events += [
        ev("checkpoint_save_started", 30, step=20),
        ev("checkpoint_saved", 330, step=20, blocking_s=300.0),
    ]
    assert hangs(ingest, events + heartbeats(341, 360)) == []


def test_a_long_save_is_not_learned_as_a_step_interval(ingest):
    """A 300 s save between 1 s steps: no hang, and a stall after it is still found at
    the floor (60 s), not at 5 x the save's gap."""
    times = [11 + i for i in range(20)] + [331 + i for i in range(10)]  # the save: 30..331
    events = start() + steps(times)
    events += [
        ev("checkpoint_save_started", 30, step=20),
        ev("checkpoint_saved", 330, step=20, blocking_s=300.0),
    ]
    [hang] = hangs(ingest, events + heartbeats(341, 500))  # no step after 340
    assert hang.fault_at.timestamp() == pytest.approx(T0 + 340)
    assert hang.detected_at.timestamp() == pytest.approx(T0 + 400)


def test_the_timeout_is_learned_from_the_launch(ingest):
    times = [11 + 20 * i for i in range(10)]  # a step every 20 s: timeout 5 x 20 = 100 s
    times += [times[-1] + 90]  # 90 s: no hang, and now the longest interval: timeout 450 s
    times += [times[-1] + 500]  # 500 s: a hang, found 450 s after the last progress
    events = start() + steps(times) + heartbeats(times[-1], times[-1] + 10)
    [hang] = hangs(ingest, events)
    assert hang.fault_at.timestamp() == pytest.approx(T0 + times[-2])
    assert hang.detected_at.timestamp() == pytest.approx(T0 + times[-2] + 450)


def test_the_node_that_fell_silent_explains_the_hang(ingest):
    """No progress says nothing of why; a node gone silent does: its host failed."""
    times = [11 + i for i in range(20)]
    events = start() + steps(times) + heartbeats(0, 200, "n0") + heartbeats(0, 40, "n1")
    [incident] = detect_all(ingest, events)
    assert (incident.fault_type, incident.cause) == ("dead_node", Incident.Cause.HOST)
    assert [n.name for n in incident.nodes.all()] == ["n1"]
    assert incident.fault_at.timestamp() == pytest.approx(T0 + 30)  # still the last progress
    assert "no heartbeat for" in incident.summary


def test_the_silent_node_of_a_one_node_launch_is_named(ingest):
    """No peer kept sending to tell the culprit by, but the dead-node detector found it."""
    times = [11 + i for i in range(20)]
    events = start(nodes=("n0",)) + steps(times) + heartbeats(0, 40, "n0")
    [incident] = detect_all(ingest, events + [ev("attempt_ended", 700, reason="failed")])
    assert (incident.fault_type, incident.cause) == ("dead_node", Incident.Cause.HOST)
    assert [n.name for n in incident.nodes.all()] == ["n0"]


def test_a_hang_then_a_kill_and_a_relaunch_is_one_incident(ingest):
    times = [11 + i for i in range(20)]
    events = (
        start()
        + steps(times)
        + [
            ev("fault", 630, node="n1", type="nccl_timeout"),  # the collective times out later
            ev("attempt_ended", 640, reason="failed"),
        ]
    )
    events += start(700, attempt=2) + steps([711 + i for i in range(30)], attempt=2)
    [incident] = detect_all(ingest, events)
    # The watchdog's report explains the hang (the network); it began at the last progress.
    assert (incident.fault_type, incident.cause) == ("nccl_timeout", Incident.Cause.NETWORK)
    assert incident.fault_at.timestamp() == pytest.approx(T0 + 30)
    assert incident.resumed_at.timestamp() == pytest.approx(T0 + 711)
    assert incident.recovered_at.timestamp() == pytest.approx(T0 + 730)  # step 21 again
    assert len(incident.evidence) == 3  # the inferred hang, the timeout, the end


def detect_all(ingest, events):
    assert ingest(events).status_code == 202
    return detect("j1")


def test_a_new_launch_warm_up_gets_the_long_timeout_too(ingest):
    """Earlier launches stepped every second, but a relaunch's first steps compile and
    set up communicators (minutes at scale): the warm-up timeout holds for them."""
    events = start() + steps([11 + i for i in range(20)])
    events += [ev("attempt_ended", 40, reason="failed")]
    events += start(100, attempt=2) + steps([111, 400], attempt=2, first=21)
    events += heartbeats(400, 900)
    assert hangs(ingest, events) == []  # a 289 s second step: warm-up
    hangs_ = hangs(ingest, heartbeats(905, 1400))
    assert [h.attempt for h in hangs_] == [2]
    assert hangs_[0].detected_at.timestamp() == pytest.approx(T0 + 400 + 900)


def test_a_first_launch_warm_up_gets_the_long_timeout(ingest):
    events = start() + steps([11, 200]) + heartbeats(200, 900)  # a slow compile: fine
    assert hangs(ingest, events) == []
    assert len(hangs(ingest, heartbeats(905, 1200))) == 1  # 1000 s after step 2


def test_the_first_step_after_a_first_warm_up_is_not_judged_by_the_floor(ingest):
    """Nothing learned yet (the warm-up intervals are not learned from): a slow node
    making the first interval after them 200 s long is no hang; the 60 s floor alone
    would call it one."""
    events = start() + steps([11, 12, 13, 14, 214, 215, 216]) + heartbeats(0, 240)
    assert hangs(ingest, events) == []


def test_the_factor_is_set_per_job(ingest):
    times = [11 + 20 * i for i in range(10)] + [11 + 20 * 9 + 90]
    events = start() + steps(times) + heartbeats(times[-1], times[-1] + 5)
    assert hangs(ingest, events) == []
    job = TrainingJob.objects.get(key="j1")
    DetectorSetting.objects.create(job=job, name="hang.factor", value=3)  # timeout 60 s
    assert len(detect_hangs()) == 1


def detect_hangs():
    return [i for i in detect("j1") if i.fault_type == "hang"]


def test_heartbeats_alone_bring_the_hang_to_light(ingest, django_capture_on_commit_callbacks):
    """Live: the steps stop, only heartbeats come; their (debounced) pass finds the hang."""
    from django.core.cache import cache

    with django_capture_on_commit_callbacks(execute=True):
        ingest(start() + steps([11 + i for i in range(20)]))
    job = TrainingJob.objects.get(key="j1")
    cache.delete(f"incident-detect:{job.id}")  # the debounce window of the batch above is over
    with django_capture_on_commit_callbacks(execute=True):
        ingest(heartbeats(31, 120))
    assert Incident.objects.get().fault_type == "hang"


def test_the_quick_pass_opens_and_the_full_pass_names_the_earlier_hang(ingest):
    from incidents import services

    times = [11 + i for i in range(20)]
    events = start() + steps(times) + [ev("fault", 630, node="n1", type="nccl_timeout")]
    assert ingest(events).status_code == 202
    job = TrainingJob.objects.get(key="j1")
    [opened] = services.incidents_detect(job=job, inferred=False)
    assert opened.fault_type == "nccl_timeout"
    assert services.incidents_detect(job=job, inferred=False) == []  # never downgrades
    [updated] = services.incidents_detect(job=job)
    # The full pass finds the hang before it: the same incident, now from the last
    # progress, still put down to the watchdog's report (it explains the hang).
    assert (updated.pk, updated.fault_type) == (opened.pk, "nccl_timeout")
    assert updated.fault_at.timestamp() == pytest.approx(T0 + 30)
    assert opened.fault_at.timestamp() == pytest.approx(T0 + 630)
    assert services.incidents_detect(job=job, inferred=False) == []
    assert Incident.objects.get().fault_at.timestamp() == pytest.approx(T0 + 30)


def test_a_hang_the_launch_comes_out_of_costs_its_stall(ingest):
    """Steps stop for 200 s, then go on in the same launch: a hang, resumed and
    recovered within the launch; it cost the stall beyond the usual 1 s step on 8 GPUs."""
    times = [11 + i for i in range(20)] + [230 + i for i in range(20)]
    [hang] = hangs(ingest, start() + steps(times) + heartbeats(11, 260))
    assert hang.fault_at.timestamp() == pytest.approx(T0 + 30)
    assert hang.resumed_at.timestamp() == pytest.approx(T0 + 230)
    assert hang.recovered_at.timestamp() == pytest.approx(T0 + 230)  # step 21
    assert hang.lost_breakdown == {"slowdown": pytest.approx((200 - 1) * 8)}
    assert hang.lost_gpu_seconds == pytest.approx((200 - 1) * 8)
    assert hang.state == Incident.State.RECOVERED
