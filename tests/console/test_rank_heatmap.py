"""The job page's rank heatmap on a launch too wide for a row per rank: a row per node
holding its slowest rank, so a slow node at high rank numbers shows; the slowest nodes
when even the nodes do not fit, with the others said to be no slower; the colour a
cell's ratio to its window's median rank on a fixed scale."""

import json
import random
import re
from datetime import UTC, datetime

import pytest

from console.charts.ranks import RATIO_COLOURS, RATIO_MAX, RATIO_MIN, cell_ratios
from console.pages import jobs as jobs_page
from jobs import selectors
from jobs.models import RankWindow
from jobs.services import cluster_get_or_create
from tests.factories import AttemptFactory, NodeFactory, TrainingJobFactory

pytestmark = pytest.mark.django_db

T0 = 1_790_000_000.0
NODES = 40
PER_NODE = 8  # 320 ranks: more than jobs_page.HEATMAP_ROWS
WINDOWS = 12
SLOW_NODE = 37  # ranks 296-303
SLOW_FROM = 8  # its last 4 windows
SLOW_FACTOR = 1.6


def wide_launch(key: str):
    """A launch of NODES x PER_NODE ranks and WINDOWS windows of +-2% noise, SLOW_NODE's
    ranks SLOW_FACTOR slower from window SLOW_FROM (written directly: through the
    ingest it would be thousands of events)."""
    cluster = cluster_get_or_create(name="east")
    job = TrainingJobFactory(key=key, cluster=cluster, status="running", revision=1)
    nodes = [NodeFactory(cluster=cluster, name=f"{key}-n{i:02d}") for i in range(NODES)]
    started = datetime.fromtimestamp(T0, UTC)
    AttemptFactory(job=job, number=1, world_size=NODES * PER_NODE, started_at=started)
    rng = random.Random(5)
    rows = []
    for w in range(WINDOWS):
        for i, node in enumerate(nodes):
            slow = SLOW_FACTOR if i == SLOW_NODE and w >= SLOW_FROM else 1.0
            for local in range(PER_NODE):
                rows.append(
                    RankWindow(
                        job=job,
                        attempt=1,
                        rank=i * PER_NODE + local,
                        node=node,
                        first_step=1 + 10 * w,
                        last_step=10 + 10 * w,
                        ts=T0 + 10 * w,
                        compute_s=0.5 * slow * (1 + rng.uniform(-0.02, 0.02)),
                        step_s=0.9,
                    )
                )
    RankWindow.objects.bulk_create(rows)
    return job


def ranks_chart(html: str) -> dict:
    body = re.search(r'data-chart="chart-ranks">(.*?)</script>', html, re.S).group(1)
    return json.loads(body)


@pytest.fixture
def viewer(client, personas):
    client.force_login(personas["viewer"].user)
    return client


def test_a_wide_launch_has_a_row_per_node_and_its_slow_node_stands_out(viewer):
    wide_launch("wide")
    html = viewer.get("/jobs/wide/").content.decode()
    fig = ranks_chart(html)
    heat = fig["data"][0]
    assert len(heat["y"]) == NODES  # every rank accounted for, 8 to a row
    labels = [y for y in heat["y"] if y.startswith(f"wide-n{SLOW_NODE} ")]
    assert len(labels) == 1 and re.fullmatch(
        r"wide-n37 \(slowest rank (29[6-9]|30[0-3])\)", labels[0]
    )
    slow_row = heat["z"][heat["y"].index(labels[0])]
    assert all(1.55 < ratio < 1.66 for ratio in slow_row[SLOW_FROM:])
    others = [v for y, row in zip(heat["y"], heat["z"], strict=True) if y != labels[0] for v in row]
    assert all(0.95 < v < 1.05 for v in others)  # the noise: one neutral colour
    assert (heat["zmin"], heat["zmax"]) == (RATIO_MIN, RATIO_MAX)
    # the hover names the slowest rank, its ratio and its seconds
    cell = heat["customdata"][heat["y"].index(labels[0])][-1]
    assert 0.78 < cell[0] < 0.83 and 296 <= cell[1] <= 303
    assert "x the window's median rank" in heat["hovertemplate"]
    assert "customdata[0]:.3f} s" in heat["hovertemplate"]
    assert "320 ranks on 40 nodes" in fig["layout"]["title"]["text"]
    assert "one row per node, each cell its slowest rank" in html
    assert "left out" not in html


def test_when_even_the_nodes_do_not_fit_the_slowest_are_kept(viewer, monkeypatch):
    job = wide_launch("wider")
    heatmap = selectors.job_rank_heatmap(job=job, attempt=1, world_size=320, max_rows=8)
    assert heatmap["by"] == "node" and len(heatmap["rows"]) == 8
    assert heatmap["left_out"] == NODES - 8 and heatmap["left_out_peak"] < 1.05
    assert any(r["label"].startswith("wider-n37 ") for r in heatmap["rows"])
    # in rank order, the rows kept
    assert [r["rank"] // PER_NODE for r in heatmap["rows"]] == sorted(
        r["rank"] // PER_NODE for r in heatmap["rows"]
    )
    monkeypatch.setattr(jobs_page, "HEATMAP_ROWS", 8)
    html = viewer.get("/jobs/wider/").content.decode()
    assert "the other 32 nodes are left out and are not slower" in html
    assert "the slowest 8 nodes" in ranks_chart(html)["layout"]["title"]["text"]


def test_a_narrow_launch_keeps_a_row_per_rank():
    job = wide_launch("narrow")
    heatmap = selectors.job_rank_heatmap(job=job, attempt=1, world_size=320, max_rows=320)
    assert heatmap["by"] == "rank" and len(heatmap["rows"]) == 320
    assert heatmap["rows"][300]["label"] == "rank 300 \u00b7 narrow-n37"
    assert heatmap["ranks"] is None and heatmap["left_out"] == 0


def test_the_colour_is_the_ratio_to_the_windows_median_on_a_fixed_scale():
    compute = [[0.8, None, 0.5, float("nan")], [0.49, 0.5, 0.5, 1.0]]
    median = [0.5, 0.5, 0, 0.5]  # a window with no positive median: no ratio
    assert cell_ratios(compute, median) == [[1.6, None, None, None], [0.98, 1.0, None, 2.0]]
    assert cell_ratios([], []) == []

    def colour(ratio):
        """The colour stop at or below `ratio`'s position on the scale."""
        at = (ratio - RATIO_MIN) / (RATIO_MAX - RATIO_MIN)
        return [c for stop, c in RATIO_COLOURS if stop <= at + 1e-9][-1]

    neutral = colour(1.0)
    # +-2% noise: one colour, between two stops of the same colour
    assert colour(0.98) == colour(1.02) == neutral
    stops = dict(RATIO_COLOURS)
    assert list(stops.values()).count(neutral) == 2
    assert colour(1.6) != neutral and colour(0.8) != neutral
