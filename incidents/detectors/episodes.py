"""The launch-fault detector: a job's fault episodes, launch by launch, from the faults
it reported (and, in the full pass, those the engine inferred).

Detection works on the job's own clock and re-derives each episode from all the
events stored so far, so a trace posted late, twice or shuffled gives the same
episodes. Faults of a launch are one episode: the earliest fault that is not a
symptom (an NCCL timeout on other ranks) initiates it; the other faults and the
launch's end attach to it as signals. An episode that a hang Rebound inferred
initiates is put down to the fault that explains it, when one comes (a reported
fault, a dead node, a watchdog's timeout: Episode.explaining). A launch that ends
failed or killed with no fault reported is an episode of its own, until a fault for
it arrives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.time import dt
from common.vocabulary import FAULT_CAUSES
from incidents.detectors.base import Finding, Signal, signal_where
from incidents.detectors.engine import Watch, steps_between
from incidents.models import Incident
from incidents.xid import APPLICATION, HARDWARE, xid_class
from jobs.models import Event, TrainingJob

LAUNCH_FAULT = "launch_fault"  # the detector's name on its incidents
SYMPTOM_TYPES = frozenset({"nccl_timeout"})
FAILED_ENDS = frozenset({"failed", "killed"})
INFERRED = "inferred:"  # the client id's prefix of the faults detectors inferred

C = Incident.Cause
S = Incident.Severity


def fault_cause(fault_type: str, xid: int | None) -> tuple[str, str]:
    """The cause and severity a fault report points to; an Xid's class decides when present."""
    if xid is not None or fault_type == "gpu_xid":
        klass = xid_class(xid)
        if klass == HARDWARE:
            return C.GPU, S.CRITICAL
        if klass == APPLICATION:
            return C.SOFTWARE, S.MAJOR
        if fault_type == "gpu_xid":
            return C.UNKNOWN, S.MAJOR
    return FAULT_CAUSES.get(fault_type, (C.UNKNOWN, S.MAJOR))


@dataclass
class Episode:
    attempt: int
    signals: list[Signal] = field(default_factory=list)
    index: int = 0  # the launch's first episode is 0; one after training went on, 1, ...

    @property
    def key(self) -> str:
        return f"launch-{self.attempt}" + (f"-{self.index}" if self.index else "")

    @property
    def initiating(self) -> Signal | None:
        faults = sorted((s for s in self.signals if s.kind == "fault"), key=lambda s: s.ts)
        causes = [s for s in faults if s.data.get("type") not in SYMPTOM_TYPES]
        return (causes or faults or [None])[0]

    @property
    def explaining(self) -> Signal | None:
        """The fault that says what went wrong: the initiating one, unless that is a
        hang Rebound inferred (no progress says nothing of why). Then a fault the job
        reported (an Xid, a crash), else a node found dead (its host), else a
        symptom reported (a watchdog's NCCL timeout: the network) explains it."""
        first = self.initiating
        if first is None or not _is_inferred_hang(first):
            return first
        faults = sorted((s for s in self.signals if s.kind == "fault"), key=lambda s: s.ts)
        reported = [s for s in faults if not s.client_id.startswith(INFERRED)]
        for candidates in (
            [s for s in reported if s.data.get("type") not in SYMPTOM_TYPES],
            [s for s in faults if _is_dead_node(s)],
            reported,
        ):
            if candidates:
                return candidates[0]
        return first

    @property
    def failed_end(self) -> Signal | None:
        """The launch's end, when it failed or was killed unasked (an end someone
        requested, such as a recovery action's relaunch, is no fault)."""
        ends = [s for s in self.signals if s.kind == "attempt_ended"]
        failed = (s for s in ends if s.data.get("reason") in FAILED_ENDS)
        return next((s for s in failed if not s.data.get("requested_by")), None)


def _launch_at(starts: list[tuple[float, int]], ts: float) -> int | None:
    """The launch running at `ts`: the latest one started by then."""
    number = None
    for start, n in starts:
        if start <= ts:
            number = n
    return number


def find_episodes(job: TrainingJob, *, cfg: dict, watch: Watch | None = None) -> list[Episode]:
    """The job's fault episodes, launch by launch.

    A launch's signals belong to one episode, started by its earliest fault
    that is not a symptom, unless training went on after it: a new fault after
    `episode.progress_steps` more steps of that launch starts a new episode.
    `watch` adds what detectors inferred from steps, windows and heartbeats
    (hangs, loss trouble, dead nodes) and lets progress be judged. Without it,
    a launch is one episode (the quick pass only opens the first).
    """
    rows = (
        Event.objects.filter(job=job, kind__in=("fault", "attempt_ended", "attempt_started"))
        .order_by("ts", "id")
        .values_list("client_id", "kind", "ts", "attempt", "node", "rank", "data")
    )
    starts: list[tuple[float, int]] = []
    signals_: list[Signal] = []
    for row in rows:
        s = Signal(*row)
        if s.kind == "attempt_started":
            starts.append((s.ts, s.attempt))
        else:
            signals_.append(s)
    starts.sort()
    if watch is not None:
        signals_ += watch.hangs + watch.losses + watch.dead_nodes
    by_launch: dict[int, list[Signal]] = {}
    for s in signals_:
        attempt = s.attempt if s.attempt is not None else _launch_at(starts, s.ts)
        if attempt is None:
            continue  # a node's fault while none of this job's launches ran
        by_launch.setdefault(attempt, []).append(s)
    progress_steps = int(cfg["episode.progress_steps"])
    episodes: list[Episode] = []
    for attempt, launch_signals in sorted(by_launch.items()):
        current = Episode(attempt)
        episodes.append(current)
        for s in sorted(launch_signals, key=lambda s: s.ts):
            first = current.initiating
            starts_anew = (
                watch is not None
                and first is not None
                and s.kind == "fault"
                and s.data.get("type") not in SYMPTOM_TYPES
                and s.data.get("type") != first.data.get("type")  # the same trouble again
                and steps_between(job, attempt, first.ts, s.ts, progress_steps) >= progress_steps
            )
            if starts_anew:
                current = Episode(attempt, index=current.index + 1)
                episodes.append(current)
            current.signals.append(s)
    return [e for e in episodes if e.initiating is not None or e.failed_end is not None]


def findings(*, job: TrainingJob, cfg: dict, watch: Watch | None) -> list[Finding]:
    """One finding per episode."""
    out = []
    for episode in find_episodes(job, cfg=cfg, watch=watch):
        fields = _episode_fields(episode)
        nodes, why = fields.pop("_nodes"), fields.pop("_why")
        out.append(Finding(LAUNCH_FAULT, episode.key, fields, nodes, episode.signals, why))
    return out


def _episode_fields(episode: Episode) -> dict:
    first = episode.explaining
    if first is not None:
        fault_type = first.data.get("type", "other")
        xid = first.data.get("xid")
        cause, severity = fault_cause(fault_type, xid)
        where = f" on {first.node}" if first.node else ""
        rank = f" rank {first.rank}" if first.rank is not None else ""
        summary = f"{fault_type}{f' (Xid {xid})' if xid is not None else ''}{where}{rank}"
        if "silent_s" in first.data:
            summary += f": no heartbeat for {first.data['silent_s']:.0f} s"
        if "no_step_s" in first.data:
            summary += (
                f": no step for {first.data['no_step_s']:.0f} s after step"
                f" {first.data['last_step']} (timeout {first.data['timeout_s']:.0f} s)"
            )
        nodes = [first.node] if first.node else []
        if not nodes:  # a hang with no culprit: the node the dead-node detector found silent
            nodes = sorted({s.node for s in episode.signals if _is_dead_node(s)})
        ranks = [first.rank] if first.rank is not None else _ranks_named(episode, first)
        # The fault began at its earliest sign, though its cause may be reported later
        # (a launch's supervisor reports the rank that died after tearing the launch
        # down, its peers' NCCL timeouts come first); it was known at the first of them.
        faults = [s for s in episode.signals if s.kind == "fault"]
        fault_ts = min(s.ts for s in faults)
        detected_ts = min(s.detected_ts if s.detected_ts is not None else s.ts for s in faults)
    else:
        first = episode.failed_end
        fault_type, xid = "crash", None
        cause, severity = C.UNKNOWN, S.MAJOR
        summary = (
            f"launch {episode.attempt} ended {first.data.get('reason')} with no fault reported"
        )
        nodes, ranks = [], []
        fault_ts = detected_ts = first.ts
    return {
        "attempt": episode.attempt,
        "cause": cause,
        "fault_type": fault_type,
        "xid": xid,
        "severity": severity,
        "summary": summary[:300],
        "ranks": ranks,
        "evidence": [s.client_id for s in episode.signals],
        "fault_at": dt(fault_ts),
        "detected_at": dt(detected_ts),
        "_nodes": nodes,
        "_why": _attribution(episode, first),
    }


def _is_inferred_hang(s: Signal) -> bool:
    return s.client_id.startswith(INFERRED) and s.data.get("type") == "hang"


def _is_dead_node(s: Signal) -> bool:
    return s.kind == "fault" and s.data.get("type") == "dead_node" and bool(s.node)


def _ranks_named(episode: Episode, first: Signal) -> list[int]:
    """The ranks a fault that names none (a node's Xid) took down: those its episode's
    other faults name on the same node, symptoms (a peer's timeout) left out."""
    return sorted(
        {
            s.rank
            for s in episode.signals
            if s.kind == "fault"
            and s.rank is not None
            and s.data.get("type") not in SYMPTOM_TYPES
            and (first.node is None or s.node == first.node)
        }
    )


def _attribution(episode: Episode, first: Signal) -> str:
    """Why the episode is put down to `first`, in words for its timeline."""
    if first.kind != "fault":
        return f"launch {episode.attempt} ended {first.data.get('reason')} with no fault reported"
    where = f" ({signal_where(first)})" if signal_where(first) else ""
    at = dt(first.ts).strftime("%H:%M:%S.%f")[:-3]
    what = f"{first.data.get('type')}{where} at {at} UTC"
    hang = episode.initiating
    if hang is not None and hang is not first:
        since = dt(hang.ts).strftime("%H:%M:%S")
        return f"{what} explains the hang of launch {episode.attempt} (no progress since {since})"
    if first.data.get("type") in SYMPTOM_TYPES:
        return f"{what} is the first fault of launch {episode.attempt}; only symptoms so far"
    return f"{what} is the first fault of launch {episode.attempt} that is not a symptom"
