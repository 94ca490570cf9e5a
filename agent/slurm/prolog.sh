#!/bin/sh
# Slurm's Prolog= on each node: the job's start on this node, reported to Rebound (hook.sh).
exec "$(dirname -- "$0")/hook.sh" prolog
