#!/bin/sh
# Slurm's Epilog= on each node: the job's end on this node and a drain of it, reported to
# Rebound (hook.sh).
exec "$(dirname -- "$0")/hook.sh" epilog
