"""Reading Slurm, for the slurm driver: its compressed host lists, `scontrol -o
show` records and `sinfo`/`squeue --json` objects turned into the driver's node
and job records; the job states; and the `rebound:` mark that makes a drain
reason or a job comment ours. Pure functions: no command runs here."""

from __future__ import annotations

import re

PREFIX = "rebound:"
RUNNING = {"RUNNING", "CONFIGURING", "SUSPENDED", "SIGNALING", "RESIZING"}
ACTIVE = RUNNING | {
    "PENDING",
    "COMPLETING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SPECIAL_EXIT",
    "STAGE_OUT",
}
DOWN = {"down", "fail", "failing", "future", "unknown"}


def mark(key: str) -> str:
    """The action key as it appears in Slurm: always with the `rebound:` prefix."""
    key = str(key).strip().replace(" ", "-")
    return key if key.startswith(PREFIX) else PREFIX + key


def stamp(job: dict, key: str) -> str | None:
    """What our action `key` wrote in the job's comment, if it wrote there."""
    words = (job.get("comment") or "").split()
    return " ".join(words[1:]) if words and words[0] == mark(key) else None


def expand_hostlist(expr: str | None) -> list[str]:
    """Slurm's compressed host lists: "node[1-3,5],gpu07" -> node1..node3, node5, gpu07."""
    if not expr or expr in ("(null)", "None"):
        return []
    parts, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    parts.append(cur)
    out: list[str] = []
    for part in filter(None, (p.strip() for p in parts)):
        m = re.match(r"^(.*?)\[([^\]]+)\](.*)$", part)
        if not m:
            out.append(part)
            continue
        head, body, tail = m.groups()
        for rng in body.split(","):
            lo, _, hi = rng.partition("-")
            if hi:
                width = len(lo) if lo.startswith("0") else 0
                names = [f"{head}{i:0{width}d}" for i in range(int(lo), int(hi) + 1)]
            else:
                names = [f"{head}{lo}"]
            for name in names:
                out.extend(expand_hostlist(name + tail) if "[" in tail else [name + tail])
    return out


_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w/:()]*)=")


def parse_scontrol_line(line: str) -> dict[str, str]:
    """One `scontrol -o show` record: Key=value pairs, values may hold spaces."""
    matches = list(_KEY.finditer(line))
    out = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


def exactly(count: int) -> str:
    """`numnodes=N-N`: with `N` alone the job keeps its old maximum and may get more."""
    return f"{count}-{count}"


def _null(value):
    return None if value in (None, "", "(null)", "None", "N/A") else value


def _exit_status(value) -> tuple[int, int]:
    """(exit code, signal) from squeue --json: a wait status (22.05) or an object (23.02+)."""
    if isinstance(value, dict):
        sig = value.get("signal") or {}
        return int(value.get("return_code") or 0), int(
            (sig.get("id") if isinstance(sig, dict) else sig) or 0
        )
    raw = int(value or 0)
    return (raw >> 8) & 0xFF, raw & 0x7F


def _node_count(j: dict) -> int:
    """A job's node count; for a pending job the requested one (squeue's node_count
    keeps a requeued job's last allocation)."""
    if str(j.get("job_state")).upper() == "PENDING":
        m = re.search(r"(?:^|,)node=(\d+)", j.get("tres_req_str") or "")
        if m:
            return int(m.group(1))
    return int(j.get("node_count") or 0)


# nodes


def node_record(name, state, flags, reason, by) -> dict:
    """{node, state, flags, drained, down, reason, reason_by, ours}."""
    reason = "" if reason in ("(null)", "none", "None") else reason
    drained = "DRAIN" in flags or state in ("drained", "draining")
    return {
        "node": name,
        "state": state,
        "flags": flags,
        "drained": drained,
        "down": state in DOWN,
        "reason": reason,
        "reason_by": by,
        "ours": reason.startswith(PREFIX),
    }


def node_from_json(n: dict) -> dict:
    """A node of `sinfo --json`."""
    return node_record(
        n["name"],
        str(n.get("state") or "").lower(),
        [str(f).upper() for f in n.get("state_flags") or []],
        n.get("reason") or "",
        n.get("reason_set_by_user"),
    )


def node_from_scontrol(rec: dict) -> dict:
    """A node of `scontrol -o show node` (parse_scontrol_line's record)."""
    base, *flags = rec.get("State", "").split("+")
    reason = rec.get("Reason") or ""
    m = re.search(r"\s*\[([^\]@]*)@[^\]]*\]$", reason)  # "why [user@time]"
    by = m.group(1) if m else None
    reason = reason[: m.start()] if m else reason
    return node_record(
        rec["NodeName"], base.rstrip("*").lower(), [f.upper() for f in flags], reason, by
    )


# jobs


def job_from_json(j: dict) -> dict:
    """A job of `squeue --json`."""
    res = j.get("job_resources") or {}
    hosts = [a["nodename"] for a in res.get("allocated_nodes") or [] if "nodename" in a]
    code, sig = _exit_status(j.get("exit_code"))
    return {
        "job": j.get("name") or "",
        "job_id": int(j["job_id"]),
        "state": str(j.get("job_state") or "").upper(),
        "reason": j.get("state_reason") or "",
        "nodes": hosts or expand_hostlist(j.get("nodes")),
        "node_count": _node_count(j),
        "restarts": int(j.get("restart_cnt") or 0),
        "requeue": bool(j.get("requeue")),
        "held": int(j.get("priority") or 0) == 0 and str(j.get("job_state")).upper() == "PENDING",
        "excluded": expand_hostlist(j.get("excluded_nodes")),
        "required": expand_hostlist(j.get("required_nodes")),
        "comment": j.get("comment") or "",
        "exit_code": code,
        "signal": sig,
        "partition": j.get("partition") or None,
        "workdir": j.get("current_working_directory") or None,
        "stdout": j.get("standard_output") or None,
    }


def job_from_scontrol(rec: dict) -> dict:
    """A job of `scontrol -o show job` (parse_scontrol_line's record)."""
    code, _, sig = (rec.get("ExitCode") or "0:0").partition(":")
    state = rec.get("JobState", "").upper()
    return {
        "job": rec.get("JobName") or "",
        "job_id": int(rec["JobId"]),
        "state": state,
        "reason": rec.get("Reason") or "",
        "nodes": expand_hostlist(_null(rec.get("NodeList"))),
        "node_count": int((rec.get("NumNodes") or "0").split("-")[0] or 0),
        "restarts": int(rec.get("Restarts") or 0),
        "requeue": rec.get("Requeue") == "1",
        "held": rec.get("Priority") == "0" and state == "PENDING",
        "excluded": expand_hostlist(_null(rec.get("ExcNodeList"))),
        "required": expand_hostlist(_null(rec.get("ReqNodeList"))),
        "comment": _null(rec.get("Comment")) or "",
        "exit_code": int(code or 0),
        "signal": int(sig or 0),
        "partition": _null(rec.get("Partition")),
        "workdir": _null(rec.get("WorkDir")),
        "stdout": _null(rec.get("StdOut")),
    }


def node_brief(n: dict) -> dict:
    return {k: n[k] for k in ("state", "flags", "drained", "reason", "ours")}


def job_brief(j: dict) -> dict:
    keys = ("job", "job_id", "state", "reason", "nodes", "node_count", "restarts", "excluded")
    return {k: j[k] for k in keys}
