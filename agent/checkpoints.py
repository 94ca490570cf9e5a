"""Where checkpoints live on disk and which of them are complete. No torch here.

A job's checkpoints are directories `<dir>/step-NNNNNNNN/` written by
`torch.distributed.checkpoint`. A save is complete only when rank 0 has
written the marker file into it, after every rank's files and dcp's metadata
(see `agent.torch_hooks.Checkpointer`); a rollback renames the marker of each
newer checkpoint to `RETIRED`, which takes it out of `latest_checkpoint`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MARKER = "rebound-checkpoint.json"
RETIRED = "rebound-retired.json"


def checkpoint_path(directory, step: int) -> Path:
    return Path(directory) / f"step-{int(step):08d}"


def checkpoint_steps(directory) -> list[int]:
    """The steps with a complete (and not retired) checkpoint under `directory`, ascending."""
    out = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return out
    for e in entries:
        if e.name.startswith("step-") and os.path.exists(os.path.join(e.path, MARKER)):
            try:
                out.append(int(e.name[5:]))
            except ValueError:
                continue
    return sorted(out)


def latest_checkpoint(directory) -> int | None:
    """The highest step with a complete checkpoint, or None."""
    steps = checkpoint_steps(directory)
    return steps[-1] if steps else None


def checkpoint_info(directory, step: int) -> dict | None:
    """What was reported when the checkpoint of `step` completed (bytes, blocking_s, uri,
    tier, saved_at), or None when it is not complete."""
    try:
        return json.loads((checkpoint_path(directory, step) / MARKER).read_text())
    except FileNotFoundError:
        return None
