"""Writes of prices: a cluster's price per GPU-hour, its currency and its node pools'
prices, set together (`cluster_pricing_set`), and the rules a price and a currency
follow, for the API and the admin alike."""

from __future__ import annotations

import logging
import re
from decimal import Decimal

from django.db import transaction

from common.errors import Invalid
from jobs.models import Attempt, Cluster, Node, NodePoolPrice

audit = logging.getLogger("rebound.audit")

CURRENCY_RE = re.compile(r"\A[A-Z]{3}\Z")
POOL_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}\Z")  # Node.pool's 64 characters
# What the columns hold: 12 digits, 4 after the point.
PRICE_MAX = Decimal("99999999.9999")
POOLS_MAX = 1000


def price_check(value: Decimal | None, *, field: str = "gpu_hour_price") -> None:
    if value is None:
        return
    if not value.is_finite() or value < 0 or value > PRICE_MAX:
        raise Invalid(
            f"A price per GPU-hour is a number from 0 to {PRICE_MAX}.",
            code="invalid_price",
            field=field,
        )
    if value != value.quantize(Decimal("0.0001")):
        raise Invalid(
            "A price per GPU-hour has at most 4 decimal places.", code="invalid_price", field=field
        )


def currency_check(value: str) -> None:
    if not isinstance(value, str) or not CURRENCY_RE.match(value):
        raise Invalid(
            "A currency is an ISO 4217 code: three capital letters A-Z, such as USD or EUR.",
            code="invalid_currency",
            field="currency",
        )


def pool_check(name: str) -> None:
    if not isinstance(name, str) or not POOL_RE.match(name):
        raise Invalid(
            "A pool name is 1 to 64 letters, digits and . _ : / - (starting with a letter"
            f" or digit): {name[:80]!r}.",
            code="invalid_pool",
            field="pools",
        )


def cluster_pricing_set(
    *,
    cluster: Cluster,
    gpu_hour_price: Decimal | None,
    currency: str,
    pools: dict[str, Decimal],
    actor: str,
) -> None:
    """Sets the cluster's price (None: no price), currency and node pools' prices: the
    pools named are all it has afterwards. All or nothing; audited."""
    price_check(gpu_hour_price)
    currency_check(currency)
    if len(pools) > POOLS_MAX:
        raise Invalid(f"At most {POOLS_MAX} pools.", code="invalid_pool", field="pools")
    for name, price in pools.items():
        pool_check(name)
        price_check(price, field=f"pools.{name}")
    with transaction.atomic():
        Cluster.objects.filter(pk=cluster.pk).update(
            gpu_hour_price=gpu_hour_price, currency=currency
        )
        NodePoolPrice.objects.filter(cluster=cluster).exclude(pool__in=list(pools)).delete()
        for name, price in pools.items():
            NodePoolPrice.objects.update_or_create(
                cluster=cluster, pool=name, defaults={"gpu_hour_price": price}
            )
        said = ", ".join(f"{k}={v}" for k, v in sorted(pools.items())) or "none"
        message = (
            f"{actor} set the prices of cluster {cluster.name}: {gpu_hour_price} {currency}"
            f" per GPU-hour, pools: {said}"
        )
        transaction.on_commit(lambda: audit.info(message))
    cluster.gpu_hour_price, cluster.currency = gpu_hour_price, currency


def node_set_pool(*, node_id: int, pool: str) -> None:
    """Puts a node in a node pool ('' takes it out): it is priced at the pool's price,
    in every launch it ran in too (their `pool_counts` move the node across)."""
    if pool:
        pool_check(pool)
    with transaction.atomic():
        nodes = Node.objects.select_for_update().filter(pk=node_id)
        old = nodes.values_list("pool", flat=True).first()
        if old is None or old == pool:
            return
        nodes.update(pool=pool)
        launches = list(
            Attempt.objects.select_for_update(of=("self",))
            .filter(nodes=node_id, pool_counts__isnull=False)
            .only("pk", "pool_counts")
        )
        for launch in launches:
            counts = dict(launch.pool_counts)
            counts[old] = counts.get(old, 0) - 1
            if counts[old] <= 0:
                del counts[old]
            counts[pool] = counts.get(pool, 0) + 1
            launch.pool_counts = counts
        Attempt.objects.bulk_update(launches, ["pool_counts"], batch_size=500)
