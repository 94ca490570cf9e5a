"""Running a training script under a real `torchrun` (CPU, gloo) that reports to a live
console, for the tests of the zero-config agent."""

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def launch_environ(**extra: str) -> dict:
    """This process's environment without what a launcher or the agent reads (so a test's
    job sees only what the test sets), with the checkout importable, plus `extra`."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("REBOUND_", "TORCHELASTIC_", "SLURM_", "TORCH_DISABLE"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    }
    return {**environ, "PYTHONPATH": str(ROOT), **extra}


@dataclass
class Run:
    returncode: int
    output: str
    wall_s: float


def torchrun(
    script: Path,
    *,
    url: str,
    token: str,
    job: str,
    nproc: int = 2,
    max_restarts: int = 0,
    env: dict | None = None,
    timeout_s: float = 240,
) -> Run:
    """`torchrun --standalone --nproc-per-node N script` with the agent's environment;
    its output (both streams) and its wall time."""
    environ = launch_environ(
        REBOUND_URL=url,
        REBOUND_TOKEN=token,
        REBOUND_JOB=job,
        OMP_NUM_THREADS="1",
        REBOUND_LAUNCH_RETRY_S="20",
        **(env or {}),
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}", str(script)]
    t0 = time.monotonic()
    done = subprocess.run(
        cmd,
        cwd=script.parent,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s,
    )
    return Run(done.returncode, done.stdout, time.monotonic() - t0)
