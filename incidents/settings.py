"""Detector parameters: the defaults, overridden per cluster and per job at run time.

A job's own DetectorSetting wins over its cluster's, which wins over the
default here. Values are read on every detection pass.
"""

from incidents.models import DetectorSetting
from jobs.models import TrainingJob

DEFAULTS: dict[str, float | int] = {
    # Crash loop (NVRx's nvrx-watch): this many launches within the window is a
    # restart storm; this many ended launches in a row that never advanced the
    # checkpoint is a loop that restarting will not fix.
    "crash_loop.launches": 5,
    "crash_loop.window_s": 1800,
    "crash_loop.no_progress_launches": 3,
    # Hang: no step for longer than factor x the longest step interval learned
    # (this launch's, past its first steps, or earlier launches', smoothed),
    # never less than the floor; more while a checkpoint save is in flight.
    "hang.factor": 5,
    "hang.floor_s": 60,
    "hang.skip_steps": 3,
    "hang.warmup_timeout_s": 900,  # before anything is learned (the first steps, no history)
    "hang.save_allowance_s": 600,
    "hang.smoothing": 0.5,
    # Straggler: a node whose ranks are slow (either score below 0.75) this many
    # complete windows in a row.
    "straggler.windows": 3,
    # Repeat offender: a node in this many incidents within the window.
    "repeat_offender.incidents": 3,
    "repeat_offender.window_s": 7 * 86400,
    # Dead node: a node that sent heartbeats and fell silent this long.
    "dead_node.timeout_s": 30,
    # Loss: NaN or infinity at once; a spike when the loss rises above the
    # rolling median of the last `window` losses by `mad_factor` robust
    # deviations and by `min_rel` of the median at least.
    "loss.window": 50,
    "loss.mad_factor": 8,
    "loss.min_rel": 0.25,
    "loss.warmup_steps": 50,
    # A fault after this many more steps of the same launch is a new episode,
    # not a symptom of the one before.
    "episode.progress_steps": 10,
}


def detector_settings(job: TrainingJob) -> dict[str, float | int]:
    """All parameters in force for `job`."""
    values = dict(DEFAULTS)
    rows = DetectorSetting.objects.filter(cluster_id=job.cluster_id, job=None).values_list(
        "name", "value"
    )
    values.update({n: v for n, v in rows if n in DEFAULTS})
    rows = DetectorSetting.objects.filter(job=job).values_list("name", "value")
    values.update({n: v for n, v in rows if n in DEFAULTS})
    return values
