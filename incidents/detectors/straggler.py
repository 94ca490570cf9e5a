"""The straggler detector: a node whose ranks stay slower than they should.

Per complete window (every rank of the launch reported it), each rank is scored
(incidents.detectors.ranks). A node is slow in a window when one of its ranks
is; it is a straggler after `straggler.windows` slow windows in a row of one
launch. The finding stays tied to the node across launches, and its cost is the
step time above the job's baseline (the median of recent normal windows) x the
world size, shown as slowdown.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from common.time import dt
from incidents.detectors.base import Finding, Signal, by_launch
from incidents.detectors.ranks import rank_scores
from incidents.detectors.state import (
    EngineState,
    LaunchState,
    Rebuild,
    SlowRun,
    SlowWindow,
    Straggler,
    Undecided,
    WindowsState,
)
from incidents.models import Incident
from jobs.models import Node

STRAGGLER = "straggler"  # the detector's name on its incidents
BASELINE_WINDOWS = 64  # the straggler cost's baseline: the median of this many normal windows
EVIDENCE_WINDOWS = 100  # slow windows named in a straggler's evidence (the count is kept)


def advance(state: EngineState, launches, windows, cfg) -> list[Straggler]:
    """Read the new rank windows; every straggler found so far."""
    worlds = {launch.number: launch.world_size for launch in launches}
    position = {launch.number: k for k, launch in enumerate(launches)}
    attempt = windows[0]
    newest = state.window_launch
    for number, rows in sorted(by_launch(attempt), key=lambda x: position.get(x[0], 0)):
        if newest is not None and position.get(number, 0) < position.get(newest, 0):
            raise Rebuild  # windows of an earlier launch after a later one's
        if newest != number and newest is not None:
            _close_launch(state, state.launches[newest])
        newest = state.window_launch = number
        ls = state.launches[number]
        world = int(worlds.get(number) or 0)
        if ls.windows is None:
            ls.windows = WindowsState(world=world)
        ws = ls.windows
        pending = ls.pending or [[] for _ in windows]
        columns = [
            np.concatenate((np.array(p, dtype=c.dtype), c[rows]))
            for p, c in zip(pending, windows, strict=True)
        ]
        if not world:
            world = int(columns[3].max()) + 1
        if ws.world != world:
            if ws.head is not None:
                raise Rebuild  # the launch's size is known now, and differs
            ws.world = world
        first = columns[1]
        if ws.head is not None and (first <= ws.head).any():
            raise Rebuild  # a rank's window behind the windows judged
        # By window and rank; a rank's window reported twice (copies under other ids
        # and times: the table's key holds the time) counts once, the first stored.
        o = np.lexsort((columns[-1], columns[3], first))
        columns = [c[o] for c in columns]
        first, rank = columns[1], columns[3]
        again = np.zeros(len(first), dtype=bool)
        again[1:] = (first[1:] == first[:-1]) & (rank[1:] == rank[:-1])
        if again.any():
            columns = [c[~again] for c in columns]
        starts, counts = np.unique(columns[1], return_counts=True)
        complete = starts[counts == world]
        if len(complete):
            keep = np.isin(columns[1], complete)
            _chunk(state, ws, number, [c[keep] for c in columns], cfg)
            ws.head = int(complete[-1])
            later = columns[1] > ws.head
        else:
            later = np.ones(len(columns[1]), dtype=bool)
        ls.pending = [c[later].tolist() for c in columns]
    found = sorted(state.stragglers.values(), key=lambda s: s.first_ts)
    # Copies: the state goes on changing in later passes.
    return [dataclasses.replace(s, ranks=list(s.ranks), evidence=list(s.evidence)) for s in found]


def _close_launch(state: EngineState, ls: LaunchState) -> None:
    """A later launch reports windows: this one's incomplete windows will never
    complete, and its streaks too short to count end."""
    ls.pending, ls.pending_from = None, None
    if ls.windows is None:
        return
    for nid, run in ls.windows.runs.items():
        if not run.confirmed:
            for held in run.windows:
                _release(state, held, nid)
    ls.windows.runs.clear()


def _chunk(state: EngineState, ws: WindowsState, number: int, columns, cfg) -> None:
    _, first, last, rank, node_id, ts, compute, step_s, _ids = columns
    world = ws.world
    shape = (len(first) // world, world)
    c = compute.reshape(shape)
    nodes = node_id.reshape(shape)
    ranks = rank.reshape(shape)
    window_first = first.reshape(shape)[:, 0]
    window_last = last.reshape(shape)[:, 0]
    window_ts = ts.reshape(shape).max(axis=1)
    window_step = step_s.reshape(shape).mean(axis=1)

    best0 = np.array(ws.best if ws.best is not None else c[0], dtype=np.float64)
    best = np.minimum.accumulate(np.vstack((best0[None, :], c)), axis=0)[1:]
    ws.best = best[-1].tolist()
    peer, own, slow_rank = rank_scores(c, best)
    # Per window and node: any of its ranks slow (one slow GPU makes the node the one
    # to replace; the streak of windows, not a vote of its ranks, rules out blips).
    ids = np.unique(nodes)
    slow_node = np.zeros((shape[0], len(ids)), dtype=bool)
    for j, nid in enumerate(ids.tolist()):
        on = nodes == nid
        slow_node[:, j] = (slow_rank & on).any(axis=1)
    names = dict(Node.objects.filter(id__in=ids.tolist()).values_list("id", "name"))
    streak = int(cfg["straggler.windows"])
    runs = ws.runs  # node id -> the slow windows of its current streak (or confirmed)
    for w in range(shape[0]):
        key = f"{number}:{int(window_first[w])}"
        steps = int(window_last[w] - window_first[w] + 1)
        window_step_s = float(window_step[w])
        slow_ids = {int(ids[j]) for j in np.flatnonzero(slow_node[w])}
        for nid in list(runs):
            if nid not in slow_ids:  # its streak ends
                run = runs.pop(nid)
                if not run.confirmed:
                    for held in run.windows:
                        _release(state, held, nid)
        straggling = False
        for nid in sorted(slow_ids):
            on = nodes[w] == nid
            detail = SlowWindow(
                key=key,
                first=int(window_first[w]),
                ts=float(window_ts[w]),
                step_s=window_step_s,
                steps=steps,
                ranks=sorted(int(r) for r in ranks[w][on & slow_rank[w]]),
                peer=float(peer[w][on].min()),
                own=float(own[w][on].min()),
            )
            run = runs.setdefault(nid, SlowRun())
            name = names.get(nid, f"node-{nid}")
            if run.confirmed:
                _count_slow(state, name, detail, world)
                straggling = True
                continue
            run.windows.append(detail)
            state.undecided.setdefault(key, Undecided(window_step_s, [])).holders.append(nid)
            if len(run.windows) >= streak:  # the streak counts: all of it is straggling
                first_w, last_w = run.windows[0], run.windows[-1]
                if name not in state.stragglers:
                    state.stragglers[name] = Straggler(
                        node=name,
                        first_ts=first_w.ts,
                        detected_ts=last_w.ts,
                        first_step=first_w.first,
                    )
                for held in run.windows:
                    state.undecided.pop(held.key, None)  # straggling: never a normal window
                    _count_slow(state, name, held, world)
                run.confirmed, run.windows = True, []
                straggling = True
        if straggling:
            state.undecided.pop(key, None)
        elif not slow_ids:
            _add_baseline(state, window_step_s)


def _release(state: EngineState, held: SlowWindow, nid: int) -> None:
    """A window of a streak too short to count: normal once no streak holds it."""
    entry = state.undecided.get(held.key)
    if entry is None:
        return
    if nid in entry.holders:
        entry.holders.remove(nid)
    if not entry.holders:
        del state.undecided[held.key]
        _add_baseline(state, entry.step_s)


def _add_baseline(state: EngineState, step_s: float) -> None:
    state.baseline = [*state.baseline, step_s][-BASELINE_WINDOWS:]


def _count_slow(state: EngineState, name: str, detail: SlowWindow, world: int) -> None:
    s = state.stragglers[name]
    baseline = float(np.median(state.baseline)) if state.baseline else 0.0
    s.ranks = sorted(set(s.ranks) | set(detail.ranks))
    s.windows += 1
    s.worst_peer = min(s.worst_peer, detail.peer)
    s.worst_own = min(s.worst_own, detail.own)
    s.excess_gpu_s += max(0.0, detail.step_s - baseline) * detail.steps * world
    if len(s.evidence) < EVIDENCE_WINDOWS:
        s.evidence.append(f"window:{detail.key}")


# --- as incidents ---------------------------------------------------------------------


def findings(stragglers: list[Straggler]) -> list[Finding]:
    """One finding per straggling node: its cost is slowdown (it interrupted nothing)."""
    C, S = Incident.Cause, Incident.Severity
    out = []
    for s in stragglers:
        scores = {"peer_score": round(s.worst_peer, 3), "own_score": round(s.worst_own, 3)}
        fields = {
            "attempt": None,
            "cause": C.STRAGGLER,
            "fault_type": "straggler",
            "xid": None,
            "severity": S.MAJOR,
            "summary": (
                f"straggler {s.node}: ranks {', '.join(map(str, sorted(s.ranks)))} slow for"
                f" {s.windows} windows from step {s.first_step} (peer score"
                f" {s.worst_peer:.2f}, own {s.worst_own:.2f})"
            )[:300],
            "ranks": sorted(s.ranks),
            "evidence": s.evidence,
            "fault_at": dt(s.first_ts),
            "detected_at": dt(s.detected_ts),
            "lost_gpu_seconds": s.excess_gpu_s,
            "lost_breakdown": {"slowdown": s.excess_gpu_s},
        }
        signal = Signal(
            client_id=s.evidence[0],
            kind="fault",
            ts=s.first_ts,
            attempt=None,
            node=s.node,
            rank=None,
            data={"type": "straggler", **scores},
        )
        out.append(Finding(STRAGGLER, f"node-{s.node}", fields, [s.node], [signal]))
    return out
