"""The incremental engine's state: what the detectors have read of a job and carry
from one pass to the next, as typed records.

It is stored as JSON on the job's DetectorState row (`EngineState.to_dict` and
`from_dict`). VERSION names the stored shape: a row of another version (version 1
was the untyped nested dicts of an earlier release, version 2 kept the windows not
complete yet as rows) or one that does not read back is not trusted: `from_dict`
raises Rebuild, and the engine builds the state again from every stored row, which
finds what it would have found.
"""

from __future__ import annotations

from dataclasses import dataclass, field

VERSION = 3
STREAMS = ("step", "window", "beat", "event")  # the tables the engine reads, by id


class Rebuild(Exception):
    """The state no longer matches what is stored: start over from every row."""


# --- hangs: per launch ----------------------------------------------------------------


@dataclass
class Hang:
    begin: float  # the last step's time before the silence
    step: int  # that step
    timeout: float
    gap: float  # how long no step came
    # The node named for it ("" for none), settled once its launch is: None until then
    culprit: str | None = None

    def to_dict(self) -> dict:
        d = {"begin": self.begin, "step": self.step, "timeout": self.timeout, "gap": self.gap}
        return d if self.culprit is None else d | {"culprit": self.culprit}

    @classmethod
    def from_dict(cls, d: dict | None) -> Hang | None:
        if d is None:
            return None
        return cls(d["begin"], d["step"], d["timeout"], d["gap"], d.get("culprit"))


@dataclass
class Verdict:
    """A launch judged to its end (a later launch trains): kept, not judged again."""

    stop: float | None
    hang: Hang | None
    learned: float

    def to_dict(self) -> dict:
        return {
            "stop": self.stop,
            "hang": self.hang and self.hang.to_dict(),
            "learned": self.learned,
        }

    @classmethod
    def from_dict(cls, d: dict | None) -> Verdict | None:
        return None if d is None else cls(d["stop"], Hang.from_dict(d["hang"]), d["learned"])


@dataclass
class StepsState:
    """The hang detector's view of one launch: its steps read so far and the longest
    step interval learned from them."""

    n: int = 0  # steps read
    last_ts: float | None = None
    last_step: int | None = None
    learned: float = 0.0
    hang: Hang | None = None  # the launch's first hang: nothing is learned after it
    smoothed_in: float = 0.0  # what earlier launches had taught when it was read
    closed: Verdict | None = None

    def to_dict(self) -> dict:
        return {
            "n": self.n,
            "last_ts": self.last_ts,
            "last_step": self.last_step,
            "learned": self.learned,
            "hang": self.hang and self.hang.to_dict(),
            "smoothed_in": self.smoothed_in,
            "closed": self.closed and self.closed.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> StepsState:
        return cls(
            n=d["n"],
            last_ts=d["last_ts"],
            last_step=d["last_step"],
            learned=d["learned"],
            hang=Hang.from_dict(d["hang"]),
            smoothed_in=d["smoothed_in"],
            closed=Verdict.from_dict(d["closed"]),
        )


# --- loss: per launch ------------------------------------------------------------------


@dataclass
class LossFinding:
    type: str  # "nan" (or infinity) or "loss_spike"
    step: int
    ts: float
    loss: float | str  # a non-finite loss as text: "nan", "inf"
    median: float | None = None  # a spike's: the rolling median and robust deviation
    robust_sd: float | None = None

    def data(self) -> dict:
        """As a fault's data (its time apart)."""
        out = {"type": self.type, "step": self.step, "loss": self.loss}
        if self.type == "loss_spike":
            out |= {"median": self.median, "robust_sd": self.robust_sd}
        return out

    def to_dict(self) -> dict:
        return {**self.data(), "ts": self.ts}

    @classmethod
    def from_dict(cls, d: dict | None) -> LossFinding | None:
        if d is None:
            return None
        return cls(d["type"], d["step"], d["ts"], d["loss"], d.get("median"), d.get("robust_sd"))


@dataclass
class LossState:
    n: int = 0  # losses read
    tail: list[float] = field(default_factory=list)  # the last `loss.window` of them
    nan: LossFinding | None = None
    spike: LossFinding | None = None

    def to_dict(self) -> dict:
        return {
            "n": self.n,
            "tail": self.tail,
            "nan": self.nan and self.nan.to_dict(),
            "spike": self.spike and self.spike.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> LossState:
        return cls(
            d["n"], d["tail"], LossFinding.from_dict(d["nan"]), LossFinding.from_dict(d["spike"])
        )


# --- stragglers ----------------------------------------------------------------------


@dataclass
class SlowWindow:
    """A complete window in which a node was slow."""

    key: str  # "<launch>:<first step>"
    first: int
    ts: float
    step_s: float
    steps: int
    ranks: list[int]  # its slow ranks
    peer: float  # their worst scores
    own: float

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "first": self.first,
            "ts": self.ts,
            "step_s": self.step_s,
            "steps": self.steps,
            "ranks": self.ranks,
            "peer": self.peer,
            "own": self.own,
        }

    @classmethod
    def from_dict(cls, d: dict) -> SlowWindow:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


@dataclass
class SlowRun:
    """A node's current streak of slow windows; once confirmed (long enough) its
    windows have been counted and the streak goes on until a normal window."""

    confirmed: bool = False
    windows: list[SlowWindow] = field(default_factory=list)


@dataclass
class WindowsState:
    """The straggler detector's view of one launch."""

    world: int
    head: int | None = None  # the first step of the last complete window judged
    best: list[float] | None = None  # each rank's best compute time so far
    runs: dict[int, SlowRun] = field(default_factory=dict)  # by node id

    def to_dict(self) -> dict:
        return {
            "world": self.world,
            "head": self.head,
            "best": self.best,
            "runs": {
                str(nid): {"confirmed": r.confirmed, "windows": [w.to_dict() for w in r.windows]}
                for nid, r in self.runs.items()
            },
        }

    @classmethod
    def from_dict(cls, d: dict) -> WindowsState:
        runs = {
            int(nid): SlowRun(r["confirmed"], [SlowWindow.from_dict(w) for w in r["windows"]])
            for nid, r in d["runs"].items()
        }
        return cls(d["world"], d["head"], d["best"], runs)


@dataclass
class Straggler:
    """A straggling node, as found so far (it stays tied to the node across launches)."""

    node: str
    first_ts: float  # the end of the first window of its first slow streak
    detected_ts: float  # the end of the window that completed the streak
    first_step: int
    ranks: list[int] = field(default_factory=list)
    windows: int = 0  # slow windows in streaks
    worst_peer: float = 1.0
    worst_own: float = 1.0
    excess_gpu_s: float = 0.0  # step time above the job's baseline, x world size
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "first_ts": self.first_ts,
            "detected_ts": self.detected_ts,
            "first_step": self.first_step,
            "ranks": self.ranks,
            "windows": self.windows,
            "worst_peer": self.worst_peer,
            "worst_own": self.worst_own,
            "excess_gpu_s": self.excess_gpu_s,
            "evidence": self.evidence,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Straggler:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


@dataclass
class Undecided:
    """A window some node's streak holds, too short to count yet: it joins the
    baseline (as a normal window) once no streak holds it."""

    step_s: float
    holders: list[int]  # node ids


# --- dead nodes: per node -------------------------------------------------------------


@dataclass
class NodeBeats:
    """A node's heartbeats as the dead-node detector keeps them: every silence longer
    than the timeout between buckets that can no longer change, and its latest
    buckets (re-read each pass)."""

    open: list[list] = field(default_factory=list)  # [id, bucket, first_ts, last_ts]
    silences: list[list[float]] = field(default_factory=list)  # [from, to]
    closed_last: float | None = None  # the last heartbeat of the closed buckets

    def to_dict(self) -> dict:
        return {"open": self.open, "silences": self.silences, "closed_last": self.closed_last}

    @classmethod
    def from_dict(cls, d: dict) -> NodeBeats:
        return cls(d["open"], d["silences"], d["closed_last"])


# --- the whole --------------------------------------------------------------------------


@dataclass
class LaunchState:
    first_ts: float  # its first row read (or its start), to place it among the launches
    started: bool = False  # steps of it were read: it may no longer move in the order
    steps: StepsState | None = None
    loss: LossState | None = None
    windows: WindowsState | None = None
    # Its windows not complete yet, column-wise, the row ids last; None when not read
    # back in this pass. Stored as the lowest of their ids (`pending_from`), not as rows:
    # at 16,384 ranks they were most of a 730 KB state written every pass. The engine
    # reads them back from there (engine._pending_read).
    pending: list[list] | None = None
    pending_from: int | None = None

    def to_dict(self) -> dict:
        pending_from = self.pending_from
        if self.pending is not None:
            pending_from = min(self.pending[-1]) if self.pending[-1] else None
        return {
            "first_ts": self.first_ts,
            "started": self.started,
            "steps": self.steps and self.steps.to_dict(),
            "loss": self.loss and self.loss.to_dict(),
            "windows": self.windows and self.windows.to_dict(),
            "pending_from": pending_from,
        }

    @classmethod
    def from_dict(cls, d: dict) -> LaunchState:
        return cls(
            first_ts=d["first_ts"],
            started=d["started"],
            steps=d["steps"] and StepsState.from_dict(d["steps"]),
            loss=d["loss"] and LossState.from_dict(d["loss"]),
            windows=d["windows"] and WindowsState.from_dict(d["windows"]),
            pending_from=d["pending_from"],
        )


@dataclass
class EngineState:
    """Everything the engine carries for one job."""

    cfg: dict[str, float]  # the settings it was built with: another value rebuilds it
    cursor: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STREAMS, 0))
    launches: dict[int, LaunchState] = field(default_factory=dict)
    beats: dict[str, NodeBeats] = field(default_factory=dict)  # by node name
    stragglers: dict[str, Straggler] = field(default_factory=dict)  # by node name
    baseline: list[float] = field(default_factory=list)  # step times of normal windows
    undecided: dict[str, Undecided] = field(default_factory=dict)  # by window key
    order: list[int] = field(default_factory=list)  # the launches in start order
    window_launch: int | None = None  # the launch whose windows were read last
    splits: dict[str, int] = field(default_factory=dict)  # steps_between's settled answers
    # Built after storage upkeep rolled raw windows up: its stragglers are judged on the
    # windows kept, so they do not change the incidents found on all of them.
    partial: bool = False

    def launch(self, number: int, first_ts: float) -> LaunchState:
        """The launch's state, new (first seen at `first_ts`) if none yet."""
        ls = self.launches.get(number)
        if ls is None:
            ls = self.launches[number] = LaunchState(first_ts)
        return ls

    def to_dict(self) -> dict:
        return {
            "v": VERSION,
            "cfg": self.cfg,
            "cursor": self.cursor,
            "launches": {str(n): ls.to_dict() for n, ls in self.launches.items()},
            "beats": {name: b.to_dict() for name, b in self.beats.items()},
            "stragglers": {name: s.to_dict() for name, s in self.stragglers.items()},
            "baseline": self.baseline,
            "undecided": {k: [u.step_s, u.holders] for k, u in self.undecided.items()},
            "order": self.order,
            "window_launch": self.window_launch,
            "splits": self.splits,
            "partial": self.partial,
        }

    @classmethod
    def from_dict(cls, d: dict) -> EngineState:
        """The state stored as `d`; Rebuild when it is of another version or does not
        read back (an older release's shape, a row edited by hand)."""
        if d.get("v") != VERSION:
            raise Rebuild
        try:
            return cls(
                cfg=d["cfg"],
                cursor={k: d["cursor"][k] for k in STREAMS},
                launches={int(n): LaunchState.from_dict(ls) for n, ls in d["launches"].items()},
                beats={name: NodeBeats.from_dict(b) for name, b in d["beats"].items()},
                stragglers={name: Straggler.from_dict(s) for name, s in d["stragglers"].items()},
                baseline=d["baseline"],
                undecided={k: Undecided(u[0], u[1]) for k, u in d["undecided"].items()},
                order=d["order"],
                window_launch=d["window_launch"],
                splits=d["splits"],
                partial=d.get("partial", False),
            )
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise Rebuild from exc
