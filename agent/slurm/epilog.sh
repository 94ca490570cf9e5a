#!/bin/sh
# Slurm's Epilog= on each node (slurmd runs it as root at the job's end):
# reports to Rebound the job's end on this node and a drain of the node
# (python -m agent.slurm_node epilog). It never fails the job: whatever goes wrong is
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
    timeout -k 1 20 "${py:-python3}" -m agent.slurm_node epilog </dev/null || true
else
    "${py:-python3}" -m agent.slurm_node epilog </dev/null || true
fi
exit 0
