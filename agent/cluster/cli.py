"""`python -m agent.cluster supervise|node-agent|status|stop`: how the local cluster
starts its own processes (detached, so nobody has to reap them), and a shell's look
at a job."""

from __future__ import annotations

import argparse
import json

from agent.cluster.local import LocalCluster, default_root
from agent.cluster.node_agent import node_agent_run
from agent.cluster.procs import detach
from agent.cluster.supervisor import Supervisor


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m agent.cluster",
        description="A local cluster on this machine: virtual nodes, real torch ranks.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("supervise", "node-agent", "status", "stop"):
        sp = sub.add_parser(name)
        sp.add_argument("--root", default=str(default_root()))
        sp.add_argument("--detach", action="store_true", help=argparse.SUPPRESS)
        if name in ("supervise", "status", "stop"):
            sp.add_argument("--job", required=True)
        if name == "supervise":
            sp.add_argument("--attempt", type=int, required=True)
        if name == "node-agent":
            sp.add_argument("--node", required=True)
    args = p.parse_args(argv)
    cluster = LocalCluster(args.root)
    if args.detach:
        detach()
    if args.command == "supervise":
        return Supervisor(cluster, args.job, args.attempt).run()
    if args.command == "node-agent":
        return node_agent_run(cluster, args.node)
    if args.command == "status":
        print(json.dumps(cluster.status(args.job), indent=1))
    elif args.command == "stop":
        print(json.dumps(cluster.stop(args.job), indent=1))
    return 0
