"""What compute costs: the one place that prices GPU-seconds.

A cluster may have a price per GPU-hour (`Cluster.gpu_hour_price`, in `currency`), and
a node pool its own (`NodePoolPrice`), which wins for the nodes of that pool
(`Node.pool`). GPU-seconds spent on several nodes are shared evenly over them, each
node at its own price: a launch runs the same number of GPUs on each of its nodes
(`gpus_per_node`), so evenly is by GPUs too. Where any share has no price (no pool
price, no cluster price), the whole has none: `None`, never a partial figure or 0.

Prices are read once for all the clusters a page or an answer shows
(`price_book`, one query), never per row; the nodes' pools are read only for the
clusters that price pools (`launch_pools`, `job_pools`: one query each), from each
launch's own count of its nodes by pool (`Attempt.pool_counts`); a launch without
one (rows written past the services) has its nodes counted, one more query.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import NamedTuple

from django.db.models import Count, Q

from jobs.models import Attempt, Cluster, Node

CENT = Decimal("0.01")
_SECONDS_PER_HOUR = Decimal(3600)


class Cost(NamedTuple):
    """An amount of money, rounded to the cent, and its ISO 4217 currency."""

    amount: Decimal
    currency: str


@dataclass
class ClusterPrices:
    price: Decimal | None  # the cluster's price per GPU-hour; None: unpriced
    currency: str
    pools: dict[str, Decimal] = field(default_factory=dict)  # pool -> its price

    def node_price(self, pool: str) -> Decimal | None:
        """A node's price per GPU-hour: its pool's, else its cluster's."""
        return self.pools.get(pool, self.price) if pool else self.price

    def mean_price(self, pools: Counter | None = None) -> Decimal | None:
        """The price per GPU-hour of GPU-seconds shared evenly over nodes counted by
        pool (`{pool: nodes}`); no nodes known: the cluster's price."""
        if not self.pools or not pools:
            return self.price
        total, nodes = Decimal(0), 0
        for pool, n in pools.items():
            p = self.node_price(pool)
            if p is None:
                return None
            total += p * n
            nodes += n
        return total / nodes if nodes else self.price


def money(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


class PriceBook:
    """The prices of some clusters, read once (`price_book`)."""

    def __init__(self, clusters: dict[int, ClusterPrices]):
        self.clusters = clusters

    def prices_pools(self, cluster_id: int) -> bool:
        """Whether the cluster prices node pools (then the nodes' pools matter)."""
        c = self.clusters.get(cluster_id)
        return bool(c and c.pools)

    def cost(
        self, cluster_id: int, gpu_seconds: float, pools: Counter | None = None
    ) -> Cost | None:
        """`gpu_seconds` of the cluster in money (a Cost), spent evenly over nodes
        counted by pool (`{pool: nodes}`, None: unknown, at the cluster's price);
        None where there is no price."""
        c = self.clusters.get(cluster_id)
        price = None if c is None else c.mean_price(pools)
        if price is None or not math.isfinite(gpu_seconds):
            return None
        amount = Decimal(repr(float(gpu_seconds))) * price / _SECONDS_PER_HOUR
        return Cost(money(amount), c.currency)


def price_book(cluster_ids) -> PriceBook:
    """The prices of these clusters (ids), their pools' included: one query."""
    clusters: dict[int, ClusterPrices] = {}
    rows = (
        Cluster.objects.filter(pk__in=set(cluster_ids))
        .order_by()
        .values_list(
            "pk", "gpu_hour_price", "currency", "pool_prices__pool", "pool_prices__gpu_hour_price"
        )
    )
    for pk, price, currency, pool, pool_price in rows:  # a row per pool (LEFT JOIN)
        c = clusters.setdefault(pk, ClusterPrices(price, currency))
        if pool is not None:
            c.pools[pool] = pool_price
    return PriceBook(clusters)


def cluster_prices(cluster: Cluster) -> ClusterPrices:
    """One cluster's prices (pricing API, admin): one query."""
    return price_book([cluster.pk]).clusters[cluster.pk]


def nodes_by_pool(node_ids) -> dict[str, int]:
    """Nodes counted by pool ('' for none): a launch's `pool_counts`. One query."""
    rows = (
        Node.objects.filter(pk__in=list(node_ids))
        .values_list("pool")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return dict(rows)


def _counted(attempt_ids) -> dict[int, Counter]:
    """Launches' nodes counted by pool from their nodes, by launch id: for launches
    without `pool_counts`. One query, counted in SQL (thousands of nodes a launch)."""
    rows = (
        Attempt.nodes.through.objects.filter(attempt_id__in=list(attempt_ids))
        .values_list("attempt_id", "node__pool")
        .annotate(n=Count("pk"))
        .order_by()
    )
    out: dict[int, Counter] = {}
    for attempt_id, pool, n in rows:
        out.setdefault(attempt_id, Counter())[pool] += n
    return out


def _pools_of(attempts) -> dict[int, Counter]:
    """(id, pool_counts) pairs -> each launch's nodes counted by pool, by id; a launch
    without nodes is left out (priced at its cluster's price)."""
    out = {}
    uncounted = []
    for pk, counts in attempts:
        if counts is None:
            uncounted.append(pk)
        elif counts:
            out[pk] = Counter(counts)
    if uncounted:
        out.update(_counted(uncounted))
    return out


def launch_pools(keys) -> dict[tuple[int, int], Counter]:
    """Per launch, keyed (job id, launch number): its nodes counted by pool. One query
    (two where a launch has no `pool_counts`)."""
    keys = {k for k in keys if k[1] is not None}
    if not keys:
        return {}
    match = Q()
    for job_id in {j for j, _ in keys}:
        match |= Q(job_id=job_id, number__in=[n for j, n in keys if j == job_id])
    rows = list(Attempt.objects.filter(match).values_list("pk", "job_id", "number", "pool_counts"))
    pools = _pools_of((pk, counts) for pk, _, _, counts in rows)
    return {(job_id, number): pools[pk] for pk, job_id, number, _ in rows if pk in pools}


def job_pools(*, job) -> Counter:
    """A job's nodes counted by pool, each node once per launch it ran in: its
    GPU-seconds spread over its launches' nodes. One query (two, as launch_pools)."""
    total: Counter = Counter()
    for counts in _pools_of(job.attempts.values_list("pk", "pool_counts")).values():
        total.update(counts)
    return total


def job_badput_cost(*, job, gpu_seconds: dict) -> Cost | None:
    """What a job's badput cost: its non-productive GPU-seconds (`gpu_seconds`, the
    ledger's by category) priced over the nodes of its launches. Two queries at most."""
    book = price_book([job.cluster_id])
    pools = job_pools(job=job) if book.prices_pools(job.cluster_id) else None
    badput = sum(v for k, v in gpu_seconds.items() if k != "productive")
    return book.cost(job.cluster_id, badput, pools)
