"""A local cluster on this machine: virtual nodes, real torch ranks, fault injection.

Owns launching the demo job (`agent.demo_train`) as real processes, keeping
track of them in a state directory any process can read, tearing a launch
down, and injecting faults. It needs neither Django nor torch, so a Celery
worker (or a shell) can drive it:

    from agent.cluster import LocalCluster

    c = LocalCluster.create("var/cluster", nodes={"node-a": 2, "node-b": 2, "node-c": 2},
                            sink={"events": "var/cluster/events.jsonl"})
    c.start_node_agents()                       # a heartbeat process per node
    c.launch("llm", nodes=["node-a", "node-b"], steps=500, ckpt_every=50)
    c.slow_rank("llm", 3, 4.0)                  # fault injection
    c.kill_rank("llm", 1)                       # -> the launch fails, its ranks are torn down
    c.replace_node("llm", "node-a")             # attempt 2 on node-b + a spare, from the checkpoint
    c.status("llm")

Each launch (an attempt) runs under a supervisor process (the torchrun of this
cluster: agent.cluster.supervisor); each node has a heartbeat process, its node
agent (agent.cluster.node_agent).

The state directory (default `var/cluster`, or $REBOUND_CLUSTER_DIR):

    cluster.json                 nodes and their slots, where events go, heartbeat period
    nodes/<node>.json            the node's flags (heartbeats on/off), read by its agent and ranks
    nodes/<node>.agent.json      the node agent's pid
    jobs/<job>/job.json          the job's latest attempt
    jobs/<job>/control.json      fault switches the ranks read every step (agent.control)
    jobs/<job>/checkpoints/      the shared checkpoint directory
    jobs/<job>/attempts/<n>/plan.json    what was launched: placement, port, training arguments
    jobs/<job>/attempts/<n>/procs.json   the supervisor's record: pids, states, exit codes
    jobs/<job>/attempts/<n>/*.log        the supervisor's and each rank's output

The package, by concern: `local` (LocalCluster: the state directory, launching,
fault injection, node agents), `supervisor` (one process per launch), `node_agent`
(one heartbeat process per node), `procs` (process helpers), `cli` (`python -m
agent.cluster supervise|node-agent|status|stop`, how the cluster starts its own
processes detached).
"""

from agent.cluster.local import (
    EXIT_CONFIG,
    EXIT_PEER_LOST,
    RUNNING,
    TERMINAL,
    ClusterError,
    LocalCluster,
    default_root,
)
from agent.cluster.procs import free_port

__all__ = [
    "EXIT_CONFIG",
    "EXIT_PEER_LOST",
    "RUNNING",
    "TERMINAL",
    "ClusterError",
    "LocalCluster",
    "default_root",
    "free_port",
]
