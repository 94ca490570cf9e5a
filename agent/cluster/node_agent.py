"""The node agent: one process per node of the local cluster, sending its heartbeats.

The wire format wants a job on every event, so it sends one `heartbeat` (node set,
no rank) per running launch that has ranks on its node, and none while it runs
nothing; the node's flags file can silence it (a node that falls silent).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from agent import control
from agent.cluster.local import LocalCluster
from agent.cluster.procs import proc_stat


def node_agent_run(cluster: LocalCluster, node: str) -> int:
    """Sends `node`'s heartbeats every `heartbeat_s` until SIGTERM; its pid is in
    nodes/<node>.agent.json while it runs."""
    info_path = cluster.root / "nodes" / f"{node}.agent.json"
    control.write_json(info_path, {"pid": os.getpid(), "start": proc_stat(os.getpid())[1]})
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    flags = control.NodeFlags(cluster.node_flags_path(node))
    interval = float(cluster.config.get("heartbeat_s", 5.0))
    sinks = {}
    try:
        while not stop:
            if flags.heartbeats():
                for st in cluster.running():
                    if node in st["nodes"]:
                        sink = sinks.get(st["job"])
                        if sink is None:
                            sink = sinks[st["job"]] = cluster.sink(st["job"], node=node)
                        sink.emit("heartbeat", {}, attempt=st["attempt"], node=node)
            deadline = time.monotonic() + interval
            while not stop and time.monotonic() < deadline:
                time.sleep(min(0.1, interval))
    finally:
        for sink in sinks.values():
            sink.close(timeout_s=1.0)  # heartbeats only: nothing worth waiting for
        with contextlib.suppress(FileNotFoundError):
            info_path.unlink()
    return 0
