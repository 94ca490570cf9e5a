"""The slurm driver's options: one frozen dataclass, built once from a
cluster's `driver_options` by `SlurmOptions.from_settings` (types coerced,
unknown keys ignored). What each option means: docs/drivers-slurm.md."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class SlurmOptions:
    slurm_conf: str | None = None  # SLURM_CONF for every command
    bin_dir: str | None = None  # where the Slurm commands are (None: PATH)
    # submissions
    partition: str | None = None
    script: str | None = None  # a path (may hold `{job}`) or the script's text ("#!...")
    workdir: str | None = None
    output: str | None = None
    sbatch_args: tuple[str, ...] = ()
    timeout: float = 30.0  # seconds per command
    # validate_node
    validate_command: str | None = None
    validate_timeout: float = 600.0
    burnin_seconds: float = 3.0
    burnin_size: int = 512
    min_gflops: float = 0.0
    poll_interval: float = 1.0
    json: bool = True  # False: parse `scontrol -o` even where --json exists
    # checkpoint_job: the signal sent to the job's steps ("USR1"); None: refused, since
    # a step process without a handler (torchrun, a plain script) dies of it
    checkpoint_signal: str | None = None

    @classmethod
    def from_settings(cls, settings: dict) -> SlurmOptions:
        """The options from a cluster's `driver_options`; unknown keys are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        opts = cls(**{k: v for k, v in settings.items() if k in known})
        return dataclasses.replace(
            opts,
            sbatch_args=tuple(opts.sbatch_args or ()),
            timeout=float(opts.timeout),
            validate_timeout=float(opts.validate_timeout),
            burnin_seconds=float(opts.burnin_seconds),
            burnin_size=int(opts.burnin_size),
            min_gflops=float(opts.min_gflops),
            poll_interval=float(opts.poll_interval),
            json=bool(opts.json),
            checkpoint_signal=str(opts.checkpoint_signal) if opts.checkpoint_signal else None,
        )
