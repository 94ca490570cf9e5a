"""Writes of the jobs app, one module per concern, the public ones re-exported here
(`from jobs import services`, `from jobs.services import X`):

- `ingest`: a batch of events stored, all or nothing, and what it projects (steps,
  rank windows, launches, checkpoints, nodes, the jobs' summaries).
- `lifecycle`: the launch and checkpoint rows ingest makes of lifecycle events.
- `history`: what a batch may not rewrite (a launch's start, a finished job) and an
  operator's reopening of a finished job.
- `follow_up`: what ingest hands on through the outbox, and its announcement in the
  worker (the `events_stored` signal, the ledger refresh).
- `ledger`: a job's stored ledger, refreshed after ingest or made current by a reader.
- `page_cache`: the job page's reads kept in the cache for the next reader.
- `nodes`: node states and clusters.
- `launches`: launch numbers handed out per launch identity, never reused.
- `pricing`: a cluster's and its node pools' prices per GPU-hour.

Errors are `common.errors` classes carrying their codes: the API answers them as they
are. Services never import tasks: the outbox sends a task by its name.
"""

from jobs.services.follow_up import events_follow_up
from jobs.services.history import HistoryConflict, JobNotFinished, job_reopen
from jobs.services.ingest import IngestResult, JobsOfAnotherCluster, events_ingest
from jobs.services.launches import LaunchReserved, launch_reserve
from jobs.services.ledger import (
    job_goodput,
    ledger_snapshot_ensure,
    ledger_snapshot_refresh,
)
from jobs.services.nodes import (
    cluster_get_or_create,
    node_claim_spare,
    node_mark_suspect,
    node_set_state,
)
from jobs.services.page_cache import (
    checkpoint_groups_ensure,
    job_recent_cached,
    job_recent_refresh,
    job_revision_cached,
    rank_heatmap_ensure,
    recent_read,
    step_buckets_ensure,
)
from jobs.services.pricing import cluster_pricing_set, node_set_pool

__all__ = [
    "HistoryConflict",
    "IngestResult",
    "JobNotFinished",
    "JobsOfAnotherCluster",
    "LaunchReserved",
    "checkpoint_groups_ensure",
    "cluster_get_or_create",
    "cluster_pricing_set",
    "events_follow_up",
    "events_ingest",
    "job_goodput",
    "job_recent_cached",
    "job_recent_refresh",
    "job_reopen",
    "job_revision_cached",
    "launch_reserve",
    "ledger_snapshot_ensure",
    "ledger_snapshot_refresh",
    "node_claim_spare",
    "node_mark_suspect",
    "node_set_pool",
    "node_set_state",
    "rank_heatmap_ensure",
    "recent_read",
    "step_buckets_ensure",
]
