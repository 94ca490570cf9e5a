"""Loss detectors: NaN or infinity at once, a spike above a rolling robust band; and their
false-positive side (noise, steady descent, a relaunch from an older checkpoint)."""

import math
import random

import pytest

from incidents.models import Incident
from tests.incidents.conftest import detect

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0
_n = iter(range(1, 10**6))


def ev(kind, ts, attempt=1, **data):
    return {
        "id": f"e{next(_n)}",
        "job": "j1",
        "kind": kind,
        "ts": T0 + ts,
        "attempt": attempt,
        "data": data,
    }


def run(losses, attempt=1, t0=0.0, first=1):
    out = [ev("attempt_started", t0, attempt, world_size=8), ev("ready", t0 + 10, attempt)]
    for i, loss in enumerate(losses):
        if isinstance(loss, float) and not math.isfinite(loss):
            loss = "NaN" if math.isnan(loss) else "Infinity"
        out.append(ev("step", t0 + 11 + i, attempt, step=first + i, loss=loss))
    return out


def descent(n, seed=0, noise=0.02):
    rng = random.Random(seed)
    return [3.0 * 0.995**i + rng.gauss(0, noise) for i in range(n)]


def loss_incidents(ingest, events):
    for i in range(0, len(events), 1000):
        assert ingest(events[i : i + 1000]).status_code == 202
    return [i for i in detect("j1") if i.fault_type in ("nan", "loss_spike")]


@pytest.mark.postgres  # SQLite stores a NaN loss as NULL
def test_nan_is_an_incident_at_once(ingest):
    losses = descent(100)
    losses[29] = math.nan
    [incident] = loss_incidents(ingest, run(losses))
    assert incident.fault_type == "nan"
    assert incident.cause == Incident.Cause.TRAINING_INSTABILITY
    assert incident.fault_at.timestamp() == pytest.approx(T0 + 11 + 29)
    assert incident.time_to_detect_s == 0


def test_infinity_counts_as_nan(ingest):
    losses = descent(40)
    losses[10] = math.inf
    [incident] = loss_incidents(ingest, run(losses))
    assert incident.fault_type == "nan"


def test_a_spike_leaves_the_band(ingest):
    losses = descent(300)
    losses[199] = losses[198] * 3
    [incident] = loss_incidents(ingest, run(losses))
    assert incident.fault_type == "loss_spike"
    assert incident.fault_at.timestamp() == pytest.approx(T0 + 11 + 199)
    assert "inferred:loss_spike:1:200" in incident.evidence


@pytest.mark.parametrize("seed", range(5))
def test_noise_and_descent_are_not_spikes(ingest, seed):
    assert loss_incidents(ingest, run(descent(600, seed=seed, noise=0.05))) == []


def test_a_relaunch_from_an_older_checkpoint_is_not_a_spike(ingest):
    """The loss jumps back up with the rollback, but in a new launch: its own band."""
    before = descent(300)
    events = run(before) + [ev("attempt_ended", 320, reason="killed")]
    events += run(descent(300)[100:300], attempt=2, t0=400, first=101)
    assert loss_incidents(ingest, events) == []
