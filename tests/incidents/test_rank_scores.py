"""The one rank-scoring rule (incidents.detectors.ranks), shared by the straggler
detector and the ranks endpoint."""

import numpy as np
import pytest

from incidents.detectors.ranks import SLOW, rank_scores


def test_peer_and_own_scores():
    compute = np.array([[0.8, 0.8, 0.8, 1.2], [0.8, 0.8, 0.8, 0.8]])
    best = np.array([[0.8, 0.8, 0.8, 0.8], [0.4, 0.8, 0.8, 0.8]])
    peer, own, slow = rank_scores(compute, best)
    assert peer[0].tolist() == pytest.approx([1.0, 1.0, 1.0, 0.8 / 1.2])
    assert own[1].tolist() == pytest.approx([0.5, 1.0, 1.0, 1.0])  # degraded alone
    assert slow.tolist() == [[False, False, False, True], [True, False, False, False]]
    assert SLOW == 0.75


def test_a_uniform_slowdown_flags_nobody():
    compute = np.array([[1.6] * 8])
    peer, own, slow = rank_scores(compute, np.array([[0.8] * 8]))
    assert peer[0].tolist() == pytest.approx([1.0] * 8)
    assert own[0].tolist() == pytest.approx([1.0] * 8) and not slow.any()


def test_a_rank_that_reported_no_compute_time_blinds_no_other():
    """A rank with compute_s 0 scores 1 and the others are judged as usual (the
    detector used to lose every rank's own score in such a window, while the ranks
    endpoint judged them: one rule now, the endpoint's)."""
    compute = np.array([[0.0, 0.8, 0.8, 0.8, 0.8]])
    best = np.array([[0.0, 0.4, 0.8, 0.8, 0.8]])
    peer, own, slow = rank_scores(compute, best)
    assert peer[0, 0] == 1.0 and own[0, 0] == pytest.approx(1.0)
    assert own[0, 1] == pytest.approx(0.5) and slow[0].tolist() == [False, True] + [False] * 3
    assert np.isfinite(peer).all() and np.isfinite(own).all()
