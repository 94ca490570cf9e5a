"""The `slurm` driver: acts on a Slurm cluster through its command-line tools
(scontrol, sbatch, scancel; sinfo/squeue --json where the installed Slurm has
it, else `scontrol -o show`).

What each operation does in Slurm terms, its options and errors:
docs/drivers-slurm.md. One module per concern: `options`, `parse` (reading
Slurm's output), `client` (the command runner, the reads, and `Commands`, one
call's record of its changes), `nodes`, `workloads`, `validation` (the burn-in)
and `driver` (the Driver interface).
"""

from recovery.drivers.slurm.driver import SlurmDriver
from recovery.drivers.slurm.options import SlurmOptions
from recovery.drivers.slurm.parse import expand_hostlist, mark, parse_scontrol_line

__all__ = ["SlurmDriver", "SlurmOptions", "expand_hostlist", "mark", "parse_scontrol_line"]
