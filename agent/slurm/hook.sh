#!/bin/sh
# What Slurm's Prolog= and Epilog= run on each node (prolog.sh, epilog.sh; slurmd runs them
# as root at a job's start and end): `hook.sh prolog|epilog` reports it to Rebound
# (python -m agent.slurm_node prolog|epilog). It never fails the job: whatever goes wrong is
# logged and it exits 0. Configuration: /etc/rebound/node.env (REBOUND_NODE_ENV names
# another file); REBOUND_PYTHON there is the python to run (default python3). README.md:
# "Instrumenting a torch job", "Slurm".
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
conf=${REBOUND_NODE_ENV:-/etc/rebound/node.env}
py=$(sed -n 's/^[[:space:]]*\(export[[:space:]]\{1,\}\)\{0,1\}REBOUND_PYTHON=["'"'"']\{0,1\}\([^"'"'"']*\).*/\2/p' "$conf" 2>/dev/null | tail -n 1)
root=$(CDPATH= cd -- "$(dirname -- "$0")/../.." 2>/dev/null && pwd)
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
if command -v timeout >/dev/null 2>&1; then
    timeout -k 1 20 "${py:-python3}" -m agent.slurm_node "$1" </dev/null || true
else
    "${py:-python3}" -m agent.slurm_node "$1" </dev/null || true
fi
exit 0
