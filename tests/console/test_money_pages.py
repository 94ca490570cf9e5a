"""Money on the pages: the incident list and page, the overview's losses, the
reliability report's total and causes, and a job's badput, each where the nodes have
a price and nothing where they have none; the `money` filter; query counts."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.templatetags.console_format import money
from incidents.costs import incident_cost
from jobs.models import NodePoolPrice
from jobs.selectors import Cost
from tests.factories import (
    AttemptFactory,
    ClusterFactory,
    NodeFactory,
    TrainingJobFactory,
    incident_row,
)
from tests.jobs.test_prices import _events

pytestmark = pytest.mark.django_db

HOUR = 3600.0
NOW = timezone.now()


def price(cluster, value, currency="USD", **pools):
    cluster.gpu_hour_price = None if value is None else Decimal(value)
    cluster.currency = currency
    cluster.save()
    for pool, p in pools.items():
        NodePoolPrice.objects.create(cluster=cluster, pool=pool, gpu_hour_price=Decimal(p))


def incident_on(cluster, pools, lost_h, *, cause="software", fault_at=None):
    job = TrainingJobFactory(cluster=cluster)
    attempt = AttemptFactory(job=job, nodes=[NodeFactory(cluster=cluster, pool=p) for p in pools])
    return incident_row(
        job,
        fault_at=fault_at or NOW - timedelta(hours=1),
        attempt=attempt.number,
        lost_s=lost_h * HOUR,
        cause=cause,
    )


@pytest.fixture
def world(personas, client):
    """East priced in USD with an h100 pool, west in EUR, north without a price."""
    east, west, north = (ClusterFactory(name=n) for n in ("east", "west", "north"))
    price(east, "2", h100="4")
    price(west, "1.5", "EUR")
    price(north, None)
    client.force_login(personas["viewer"].user)
    return {
        "east": incident_on(east, ["h100", "h100"], 500, cause="gpu"),  # $2,000
        "mixed": incident_on(east, ["h100", ""], 1, cause="network"),  # $3.00
        "west": incident_on(west, [""], 1000, cause="network"),  # 1,500 EUR
        "north": incident_on(north, [""], 7, cause="hang"),  # no price
    }


def test_the_money_filter():
    assert money(Cost(Decimal("1234.4"), "USD")) == "$1,234"
    assert money(Cost(Decimal("1234.5"), "EUR")) == "1,235 EUR"
    assert money(Cost(Decimal("3.47"), "USD")) == "$3.47"
    assert money((Decimal("0.00"), "GBP")) == "0.00 GBP"
    assert money({"EUR": Decimal("1500"), "USD": Decimal("2003")}) == "1,500 EUR + $2,003"
    assert money(None) == money({}) == "\u2013"


def test_the_incident_list_shows_money_where_priced(client, world):
    html = client.get("/incidents/").content.decode()
    assert '<td class="num" data-cost>$2,000</td>' in html
    assert '<td class="num" data-cost>$3.00</td>' in html
    assert '<td class="num" data-cost>1,500 EUR</td>' in html
    assert html.count('<td class="num" data-cost>\u2013</td>') == 1  # north's


def test_the_incident_page_shows_money_only_where_priced(client, world):
    html = client.get(f"/incidents/{world['east'].pk}/").content.decode()
    assert "$2,000 at the nodes' prices" in html and "GPU-hours · $2,000</h2>" in html
    html = client.get(f"/incidents/{world['north'].pk}/").content.decode()
    assert "data-cost" not in html and " · $" not in html and "EUR" not in html


def test_the_overview_shows_lost_money_today_and_this_week(client, world):
    html = client.get("/").content.decode()
    assert html.count("<small data-cost>1,500 EUR + $2,003</small>") == 2


def test_the_overview_shows_no_money_without_prices(client, personas):
    north = ClusterFactory(name="north")
    price(north, None)
    incident_on(north, [""], 3)
    client.force_login(personas["viewer"].user)
    assert "data-cost" not in client.get("/").content.decode()


def test_the_reliability_page_shows_the_total_and_each_cause(client, world):
    r = client.get("/reliability/", {"range": "7d"})
    html = r.content.decode()
    report = r.context["report"]
    assert report["lost_cost"] == {"EUR": Decimal("1500.00"), "USD": Decimal("2003.00")}
    assert "1,500 EUR + $2,003, and 7 GPU-hours without a price" in html
    causes = {c["cause"]: c for c in r.context["causes"]}
    assert set(causes["network"]["lost_cost"]) == {"EUR", "USD"}
    assert '<td class="num" data-cost>$2,000</td>' in html  # gpu
    assert '<td class="num" data-cost>1,500 EUR + $3.00</td>' in html  # network
    assert '<td class="num" data-cost>\u2013</td>' in html  # hang: unpriced
    by_cause = sum(
        (sum(c["lost_cost"].values(), Decimal(0)) for c in report["by_cause"].values()),
        Decimal(0),
    )
    assert by_cause == sum(incident_cost(i)[0] for k, i in world.items() if k != "north")


def test_the_job_page_shows_its_badput_in_money(client, personas, ingest):
    assert ingest(_events("llm", ["g1", "g2"])).status_code == 202
    client.force_login(personas["viewer"].user)
    assert "Badput cost" not in client.get("/jobs/llm/").content.decode()  # no price yet
    price(ClusterFactory(name="east"), "3600")  # a dollar a GPU-second
    r = client.get("/jobs/llm/")
    badput = sum(v for k, v in r.context["figures"]["gpu_seconds"].items() if k != "productive")
    assert r.context["badput_cost"] == Cost(Decimal(badput).quantize(Decimal("0.01")), "USD")
    assert f"<b data-cost>{money(r.context['badput_cost'])}</b>" in r.content.decode()


def _queries(client, url) -> int:
    with CaptureQueriesContext(connection) as q:
        assert client.get(url).status_code == 200
    return len(q.captured_queries)


@pytest.mark.parametrize("url", ["/incidents/", "/reliability/?range=7d", "/"])
def test_priced_pages_do_not_query_per_incident(client, world, url):
    few = _queries(client, url)
    east = world["east"].cluster
    for k in range(40):
        incident_on(east, ["h100", "", "l4"][: k % 3 + 1], 1, fault_at=NOW - timedelta(hours=k))
    assert _queries(client, url) == few
