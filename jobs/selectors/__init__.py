"""Reads of the jobs app; they never write (the database or the cache). One module
per concern, the public reads re-exported here (`from jobs import selectors`):

- `activity`: whether a running job is still heard from (`silent` past a threshold).
- `launches`: a job's launches and checkpoints (the latest of each asked for in one
  place), the job list with its summaries, the status a job's latest launch gives it.
- `ledger`: a job's goodput figures (its stored snapshot, or computed) and the last
  hour's goodput of many running jobs.
- `steps`: the job page's step series, reduced to buckets, and goodput over time.
- `charts`: the job page's checkpoint groups and rank heat map.
- `prices`: what GPU-seconds cost (cluster and node-pool prices per GPU-hour).

Where a read is worth keeping for the next reader (a ledger, the step buckets), the
service of the same concern in `jobs.services` stores it.
"""

from jobs.selectors.activity import (
    ACTIVITIES,
    SILENT,
    JobActivity,
    job_activity,
    job_silent_after_s,
    jobs_silent_q,
)
from jobs.selectors.charts import job_checkpoint_groups, job_rank_heatmap
from jobs.selectors.launches import (
    attach_summaries,
    attempts_latest_first,
    checkpoints_durable_latest_by_launch,
    checkpoints_durable_latest_first,
    job_attempts,
    job_checkpoints,
    job_latest_attempt,
    job_latest_durable_checkpoint,
    job_launches,
    job_list,
    job_recent_checkpoints,
    job_status,
    launch_node_names,
    with_effective_end,
)
from jobs.selectors.ledger import (
    job_goodput,
    job_ledger_snapshot,
    jobs_recent_goodput,
    snapshot_usable,
)
from jobs.selectors.prices import (
    Cost,
    PriceBook,
    cluster_prices,
    job_badput_cost,
    launch_pools,
    price_book,
)
from jobs.selectors.steps import (
    BUCKET_COLUMNS,
    StepBuckets,
    group_rows,
    job_goodput_timeline,
    job_step_buckets,
    kept_ranges,
    kept_shares,
    launch_order,
    step_buckets_key,
)

__all__ = [
    "ACTIVITIES",
    "BUCKET_COLUMNS",
    "SILENT",
    "Cost",
    "JobActivity",
    "PriceBook",
    "StepBuckets",
    "attach_summaries",
    "attempts_latest_first",
    "checkpoints_durable_latest_by_launch",
    "checkpoints_durable_latest_first",
    "cluster_prices",
    "group_rows",
    "job_activity",
    "job_attempts",
    "job_badput_cost",
    "job_checkpoint_groups",
    "job_checkpoints",
    "job_goodput",
    "job_goodput_timeline",
    "job_latest_attempt",
    "job_latest_durable_checkpoint",
    "job_launches",
    "job_ledger_snapshot",
    "job_list",
    "job_rank_heatmap",
    "job_recent_checkpoints",
    "job_silent_after_s",
    "job_status",
    "job_step_buckets",
    "jobs_recent_goodput",
    "jobs_silent_q",
    "kept_ranges",
    "kept_shares",
    "launch_node_names",
    "launch_order",
    "launch_pools",
    "price_book",
    "snapshot_usable",
    "step_buckets_key",
    "with_effective_end",
]
