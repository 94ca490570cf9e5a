"""What incidents cost (incidents.costs): priced over the nodes of the launch they
interrupted, on the incident API (list and detail), in the reliability report (the
total and by cause, per currency, equal to the sum of the incidents' costs) and
as the function other code calls (`incident_cost`); no price -> null."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from incidents import selectors
from incidents.costs import incident_cost, lost_recent
from incidents.selectors import lost_gpu_hours_recent
from jobs.models import NodePoolPrice
from tests.factories import (
    AttemptFactory,
    ClusterFactory,
    NodeFactory,
    TrainingJobFactory,
    incident_row,
)

pytestmark = pytest.mark.django_db

HOUR = 3600.0
T = datetime(2026, 3, 10, 12, tzinfo=UTC)


def price(cluster, value, currency="USD", **pools):
    cluster.gpu_hour_price = None if value is None else Decimal(value)
    cluster.currency = currency
    cluster.save()
    for pool, p in pools.items():
        NodePoolPrice.objects.create(cluster=cluster, pool=pool, gpu_hour_price=Decimal(p))


def incident_on(cluster, pools, lost_h, *, cause="software", fault_at=T, job=None, nodes=()):
    """An incident that lost `lost_h` GPU-hours of a launch on one node per pool."""
    job = job or TrainingJobFactory(cluster=cluster)
    attempt = AttemptFactory(job=job, nodes=[NodeFactory(cluster=cluster, pool=p) for p in pools])
    return incident_row(
        job,
        fault_at=fault_at,
        attempt=attempt.number,
        lost_s=lost_h * HOUR,
        cause=cause,
        nodes=nodes,
    )


def test_the_clusters_price(personas):
    east = ClusterFactory(name="east")
    price(east, "2.00", "EUR")
    i = incident_on(east, ["", ""], 5)
    assert incident_cost(i) == (Decimal("10.00"), "EUR")


def test_the_pools_price_wins_and_the_faulty_node_does_not_decide(personas):
    east = ClusterFactory(name="east")
    price(east, "2", h100="6", l4="1")
    faulty = NodeFactory(cluster=east, pool="l4")  # the incident names it; the launch ran on h100
    i = incident_on(east, ["h100", "h100"], 2, nodes=[faulty])
    assert incident_cost(i) == (Decimal("12.00"), "USD")


def test_mixed_pools_are_priced_per_node(personas):
    east = ClusterFactory(name="east")
    price(east, "1", h100="5")
    i = incident_on(east, ["h100", "", "", ""], 4)  # (5 + 1 + 1 + 1) / 4 = 2 per GPU-hour
    assert incident_cost(i) == (Decimal("8.00"), "USD")


def test_no_launch_nodes_the_clusters_price_and_no_price_none(personas):
    east = ClusterFactory(name="east")
    price(east, "3", h100="5")
    job = TrainingJobFactory(cluster=east)
    tied_to_none = incident_row(job, fault_at=T, attempt=None, lost_s=HOUR)
    assert incident_cost(tied_to_none) == (Decimal("3.00"), "USD")
    west = ClusterFactory(name="west")
    price(west, None)
    assert incident_cost(incident_on(west, ["h100"], 1)) is None
    price(east, None)
    assert incident_cost(incident_on(east, ["h100", "a100"], 1)) is None  # a100: no price


def test_the_api_shows_cost_and_currency_or_nulls(personas):
    east, west = ClusterFactory(name="east"), ClusterFactory(name="west")
    price(east, "2.50", "EUR", h100="4")
    price(west, None)
    priced = incident_on(east, ["h100", ""], 3)  # (4 + 2.5) / 2 x 3 = 9.75
    unpriced = incident_on(west, [""], 3)
    viewer = personas["viewer"].client()
    rows = {r["id"]: r for r in viewer.get("/api/v1/incidents/").json()["results"]}
    assert (rows[priced.pk]["lost_cost"], rows[priced.pk]["currency"]) == (9.75, "EUR")
    assert (rows[unpriced.pk]["lost_cost"], rows[unpriced.pk]["currency"]) == (None, None)
    detail = viewer.get(f"/api/v1/incidents/{priced.pk}").json()
    assert (detail["lost_cost"], detail["currency"]) == (9.75, "EUR")
    assert viewer.get(f"/api/v1/incidents/{unpriced.pk}").json()["lost_cost"] is None


def _list_queries(client) -> int:
    with CaptureQueriesContext(connection) as q:
        assert client.get("/api/v1/incidents/").status_code == 200
    return len(q.captured_queries)


def test_the_list_prices_a_page_in_a_fixed_number_of_queries(personas):
    east = ClusterFactory(name="east")
    price(east, "1", h100="4")
    viewer = personas["viewer"].client()
    incident_on(east, ["h100", "l4"], 1)
    _list_queries(viewer)  # the token's first use is written down once
    few = _list_queries(viewer)
    for k in range(30):
        incident_on(east, ["h100"] * (k % 3 + 1), 1, fault_at=T - timedelta(hours=k))
    assert _list_queries(viewer) == few


def test_the_reliability_total_by_cause_is_the_sum_of_the_incidents_costs(personas):
    east, west = ClusterFactory(name="east"), ClusterFactory(name="west")
    price(east, "2.10", h100="4.30")
    price(west, "1.70", "EUR")
    gpu = [incident_on(east, ["h100", ""], h, cause="gpu") for h in (1.337, 2.5, 0.01)]
    net = [incident_on(east, ["h100"], 0.7777, cause="network")]
    net += [incident_on(west, [""], 3.3333, cause="network")]
    unpriced = ClusterFactory(name="north")
    price(unpriced, None)
    hang = incident_on(unpriced, [""], 2, cause="hang")
    start, end = T - timedelta(days=1), T + timedelta(days=1)
    report = selectors.reliability(cluster=None, start=start, end=end)

    def summed(incidents) -> dict:
        out = {}
        for i in incidents:
            cost = incident_cost(i)
            if cost:
                out[cost[1]] = out.get(cost[1], Decimal(0)) + cost[0]
        return out

    assert report["by_cause"]["gpu"]["lost_cost"] == summed(gpu)
    assert report["by_cause"]["network"]["lost_cost"] == summed(net)
    assert set(report["by_cause"]["network"]["lost_cost"]) == {"USD", "EUR"}
    assert report["by_cause"]["hang"]["lost_cost"] == {}
    assert report["lost_cost"] == summed([*gpu, *net, hang])
    assert report["unpriced_lost_gpu_hours"] == pytest.approx(2.0)
    # The API says the same, as numbers.
    body = (
        personas["viewer"]
        .client()
        .get("/api/v1/reliability", {"start": start.isoformat(), "end": end.isoformat()})
        .json()
    )
    assert body["lost_cost"] == {k: float(v) for k, v in summed([*gpu, *net]).items()}
    assert body["by_cause"]["gpu"]["lost_cost"] == {"USD": float(summed(gpu)["USD"])}
    assert body["unpriced_lost_gpu_hours"] == pytest.approx(2.0)
    # One cluster: its currency only.
    east_only = selectors.reliability(cluster="east", start=start, end=end)
    assert east_only["lost_cost"] == summed([*gpu, net[0]])


def test_lost_money_today_and_this_week():
    east = ClusterFactory(name="east")
    price(east, "10")
    now = datetime(2026, 3, 10, 12, tzinfo=UTC)
    incident_on(east, [""], 1, fault_at=now - timedelta(hours=1))
    incident_on(east, [""], 2, fault_at=now - timedelta(days=2))
    incident_on(east, [""], 4, fault_at=now - timedelta(days=9))
    recent = lost_recent(now=now)
    assert recent["today_cost"] == {"USD": Decimal("10.00")}
    assert recent["week_cost"] == {"USD": Decimal("30.00")}
    # the GPU-hours as the overview counted them before it showed money
    hours = lost_gpu_hours_recent(now=now)
    assert (recent["today"], recent["week"]) == pytest.approx((hours["today"], hours["week"]))
    assert (recent["today_since"], recent["week_since"]) == (
        hours["today_since"],
        hours["week_since"],
    )
    price(east, None)
    recent = lost_recent(now=now)
    assert (recent["today_cost"], recent["week_cost"], recent["week"]) == ({}, {}, 3.0)
