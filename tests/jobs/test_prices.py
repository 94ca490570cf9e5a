"""What GPU-seconds cost (jobs.selectors.prices): the cluster's price, a node pool's
price winning for its nodes, GPU-seconds shared evenly over the nodes of several
pools, no price -> None (never 0); a job's badput in money on its goodput answer; the
pricing endpoint (roles, validation) and the admin."""

import importlib
from collections import Counter
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.models import Attempt, Cluster, NodePoolPrice, TrainingJob
from jobs.selectors import Cost, job_badput_cost, launch_pools, price_book
from jobs.services import node_set_pool
from tests.factories import AttemptFactory, ClusterFactory, NodeFactory, TrainingJobFactory

pytestmark = pytest.mark.django_db

HOUR = 3600.0


def priced(name="east", price="2.50", currency="USD", **pools) -> Cluster:
    cluster = ClusterFactory(name=name)
    cluster.gpu_hour_price = None if price is None else Decimal(price)
    cluster.currency = currency
    cluster.save()
    for pool, p in pools.items():
        NodePoolPrice.objects.create(cluster=cluster, pool=pool, gpu_hour_price=Decimal(p))
    return cluster


def launch(cluster, pools: list[str], job=None):
    """A launch of `job` (a new one when None) on one node per entry of `pools`."""
    job = job or TrainingJobFactory(cluster=cluster)
    nodes = [NodeFactory(cluster=cluster, pool=p) for p in pools]
    return AttemptFactory(job=job, nodes=nodes)


# --- the price book ----------------------------------------------------------------------


def test_the_clusters_price_prices_its_gpu_seconds():
    east = priced(price="2.50")
    book = price_book([east.pk])
    assert book.cost(east.pk, 10 * HOUR) == Cost(Decimal("25.00"), "USD")
    assert book.cost(east.pk, 1.0) == Cost(Decimal("0.00"), "USD")  # to the cent
    assert book.cost(east.pk, 7 * HOUR, None) == Cost(Decimal("17.50"), "USD")


def test_no_price_anywhere_is_none_not_zero():
    east = priced(price=None)
    book = price_book([east.pk])
    assert book.cost(east.pk, 10 * HOUR) is None
    assert book.cost(east.pk, 0.0) is None
    assert price_book([]).cost(east.pk, HOUR) is None  # a cluster the book did not read


def test_a_pools_price_wins_for_its_nodes():
    east = priced(price="2", h100="4")
    book = price_book([east.pk])
    a = launch(east, ["h100", "h100"])
    pools = launch_pools([(a.job_id, a.number)])[(a.job_id, a.number)]
    assert book.cost(east.pk, 10 * HOUR, pools) == Cost(Decimal("40.00"), "USD")
    # a pool with no price of its own, or no pool: the cluster's
    b = launch(east, ["a100", ""])
    pools = launch_pools([(b.job_id, b.number)])[(b.job_id, b.number)]
    assert book.cost(east.pk, 10 * HOUR, pools) == Cost(Decimal("20.00"), "USD")


def test_mixed_pools_share_the_gpu_seconds_evenly_over_the_nodes():
    east = priced(price="1", h100="4", a100="2")
    book = price_book([east.pk])
    a = launch(east, ["h100", "a100", "a100", "l4"])  # (4 + 2 + 2 + 1) / 4 per GPU-hour
    pools = launch_pools([(a.job_id, a.number)])[(a.job_id, a.number)]
    assert dict(pools) == {"h100": 1, "a100": 2, "l4": 1}
    assert book.cost(east.pk, 8 * HOUR, pools) == Cost(Decimal("18.00"), "USD")


def test_a_node_without_a_price_leaves_the_whole_unpriced():
    east = priced(price=None, currency="EUR", h100="4")
    book = price_book([east.pk])
    a = launch(east, ["h100", "h100"])
    b = launch(east, ["h100", "a100"])  # a100: no pool price, no cluster price
    pools = launch_pools([(a.job_id, a.number), (b.job_id, b.number)])
    assert book.cost(east.pk, HOUR, pools[(a.job_id, a.number)]) == Cost(Decimal("4.00"), "EUR")
    assert book.cost(east.pk, HOUR, pools[(b.job_id, b.number)]) is None
    assert book.cost(east.pk, HOUR) is None  # no nodes known: the cluster's (none)


def test_prices_of_many_clusters_are_one_query_and_pools_one_more():
    clusters = [priced(f"c{k}", str(k + 1), **{"h100": "9", "l4": "1"}) for k in range(5)]
    keys = []
    for c in clusters:
        for _ in range(3):
            a = launch(c, ["h100", "l4", "l4"])
            keys.append((a.job_id, a.number))
    with CaptureQueriesContext(connection) as q:
        book = price_book([c.pk for c in clusters])
        pools = launch_pools(keys)
    assert len(q.captured_queries) == 2
    assert len(pools) == 15
    assert book.cost(clusters[0].pk, 3 * HOUR, pools[keys[0]]) == Cost(Decimal("11.00"), "USD")


def test_a_launch_keeps_its_nodes_counted_by_pool_and_a_moved_node_moves_across(ingest):
    """Ingest counts a launch's nodes by pool when it starts; a node put in another pool
    moves in the count of every launch it ran in; pricing reads the counts, one row a
    launch, and counts the nodes of a launch without them (rows written past the
    services) as they are."""
    east = priced(price="1", h100="3")
    for name, pool in (("g1", "h100"), ("g2", "")):
        NodeFactory(cluster=east, name=name, pool=pool)
    assert ingest(_events("llm", ["g1", "g2"])).status_code == 202
    job = TrainingJob.objects.get(key="llm")
    assert [a.pool_counts for a in job.attempts.order_by("number")] == [{"h100": 1, "": 1}] * 2
    g2 = east.nodes.get(name="g2")
    node_set_pool(node_id=g2.pk, pool="h100")
    node_set_pool(node_id=g2.pk, pool="h100")  # no move: nothing changes
    assert [a.pool_counts for a in job.attempts.all()] == [{"h100": 2}] * 2
    node_set_pool(node_id=g2.pk, pool="l4")
    assert [a.pool_counts for a in job.attempts.all()] == [{"h100": 1, "l4": 1}] * 2
    keys = [(job.pk, 1), (job.pk, 2)]
    with CaptureQueriesContext(connection) as q:
        stored = launch_pools(keys)
    assert len(q.captured_queries) == 1
    job.attempts.update(pool_counts=None)
    with CaptureQueriesContext(connection) as q:
        assert launch_pools(keys) == stored == {k: Counter({"h100": 1, "l4": 1}) for k in keys}
    assert len(q.captured_queries) == 2


def test_the_migration_counts_the_launches_made_before_it():
    from django.apps import apps

    migration = importlib.import_module("jobs.migrations.0016_launch_pool_counts")
    east = priced(price="1", h100="3")
    a = launch(east, ["h100", "h100", ""])
    empty = AttemptFactory(job=a.job)
    Attempt.objects.update(pool_counts=None)
    migration.count_every_launchs_nodes_by_pool(apps, None)
    a.refresh_from_db()
    empty.refresh_from_db()
    assert (a.pool_counts, empty.pool_counts) == ({"h100": 2, "": 1}, {})


def test_the_admin_moves_a_node_through_the_service(client, django_user_model):
    east = priced(price="1", h100="3")
    a = launch(east, ["", ""])
    node = a.nodes.order_by("name").first()
    client.force_login(django_user_model.objects.create_superuser("root", "r@example.com", "x"))
    form = {"cluster": east.pk, "name": node.name, "state": "active", "registered": "on"}
    r = client.post(f"/admin/jobs/node/{node.pk}/change/", {**form, "pool": "h100"})
    assert r.status_code == 302, r.content.decode()[:3000]
    node.refresh_from_db()
    a.refresh_from_db()
    assert node.pool == "h100" and a.pool_counts == {"h100": 1, "": 1}


# --- a job's badput in money -----------------------------------------------------------


def _events(job, nodes):
    """A job of two launches: the first crashes after 10 steps, the second completes."""
    ev = []

    def add(kind, ts, attempt=None, **fields):
        e = {"id": f"{job}-{len(ev)}", "job": job, "kind": kind, "ts": 1_790_000_000 + ts}
        if attempt is not None:
            e["attempt"] = attempt
        ev.append({**e, **fields})

    for attempt, start in ((1, 0), (2, 400)):
        add(
            "attempt_started",
            start,
            attempt,
            data={"world_size": 16, "gpus_per_node": 8, "nodes": nodes},
        )
        add("ready", start + 10, attempt)
        for step in range(1, 11):
            add("step", start + 10 + step * 10, attempt, data={"step": step})
    add("fault", 150, 1, node=nodes[0], data={"type": "crash"})
    add("attempt_ended", 151, 1, data={"reason": "failed"})
    add("attempt_ended", 510, 2, data={"reason": "completed"})
    add("job_finished", 511, 2)
    return ev


def test_the_goodput_answer_prices_the_jobs_badput(personas, ingest):
    assert ingest(_events("llm", ["g1", "g2"])).status_code == 202
    east = priced(price="3.60", h100="7.20")
    viewer = personas["viewer"].client()
    body = viewer.get("/api/v1/jobs/llm/goodput").json()
    badput_gpu_s = sum(v for k, v in body["gpu_seconds"].items() if k != "productive")
    assert badput_gpu_s > 0
    assert body["currency"] == "USD"
    assert body["badput_cost"] == pytest.approx(round(badput_gpu_s / HOUR * 3.60, 2))
    # Its nodes move to the h100 pool: the pool's price wins.
    for node in east.nodes.filter(name__in=["g1", "g2"]):
        node_set_pool(node_id=node.pk, pool="h100")
    body = viewer.get("/api/v1/jobs/llm/goodput").json()
    assert body["badput_cost"] == pytest.approx(round(badput_gpu_s / HOUR * 7.20, 2))
    # A window's badput is the window's.
    window = viewer.get("/api/v1/jobs/llm/goodput", {"start": 1_790_000_300}).json()
    bad = sum(v for k, v in window["gpu_seconds"].items() if k != "productive")
    assert window["badput_cost"] == pytest.approx(round(bad / HOUR * 7.20, 2))


def test_a_job_on_a_cluster_without_a_price_has_a_null_cost(personas, ingest):
    assert ingest(_events("llm", ["g1", "g2"])).status_code == 202
    body = personas["viewer"].client().get("/api/v1/jobs/llm/goodput").json()
    assert body["badput_cost"] is None and body["currency"] is None


def test_job_badput_cost_spreads_over_every_launchs_nodes():
    east = priced(price="1", h100="3")
    job = TrainingJobFactory(cluster=east)
    launch(east, ["h100", "h100"], job=job)
    launch(east, ["", ""], job=job)  # the second launch on unpooled nodes
    cost = job_badput_cost(job=job, gpu_seconds={"productive": 99 * HOUR, "stalled": HOUR})
    assert cost == Cost(Decimal("2.00"), "USD")  # (3 + 3 + 1 + 1) / 4


# --- the pricing endpoint --------------------------------------------------------------

URL = "/api/v1/clusters/east/pricing"
BODY = {"gpu_hour_price": 2.5, "currency": "EUR", "pools": {"h100": 4, "a100": "3.25"}}


def test_viewers_read_the_prices_and_only_admins_set_them(personas):
    priced(price=None)
    r = personas["viewer"].client().get(URL)
    assert r.status_code == 200
    assert r.json() == {"cluster": "east", "gpu_hour_price": None, "currency": "USD", "pools": {}}
    for who in ("viewer", "operator", "ingest"):
        assert personas[who].client().put(URL, BODY, format="json").status_code == 403
    assert personas["outsider"].client().get(URL).status_code == 403
    r = personas["admin"].client().put(URL, BODY, format="json")
    assert r.status_code == 200, r.content
    assert r.json() == {
        "cluster": "east",
        "gpu_hour_price": 2.5,
        "currency": "EUR",
        "pools": {"a100": 3.25, "h100": 4.0},
    }
    east = Cluster.objects.get(name="east")
    assert (east.gpu_hour_price, east.currency) == (Decimal("2.5"), "EUR")
    # The pools named are all it has afterwards.
    r = personas["admin"].client().put(URL, {**BODY, "pools": {"h100": 5}}, format="json")
    assert r.json()["pools"] == {"h100": 5.0}
    assert list(NodePoolPrice.objects.values_list("pool", "gpu_hour_price")) == [
        ("h100", Decimal("5"))
    ]
    r = (
        personas["admin"]
        .client()
        .put(URL, {"gpu_hour_price": None, "currency": "USD", "pools": {}}, format="json")
    )
    assert r.json()["gpu_hour_price"] is None and not NodePoolPrice.objects.exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gpu_hour_price": -1}, "gpu_hour_price"),
        ({"gpu_hour_price": "abc"}, "gpu_hour_price"),
        ({"gpu_hour_price": 1.23456}, "gpu_hour_price"),
        ({"gpu_hour_price": 1e12}, "gpu_hour_price"),
        ({"gpu_hour_price": True}, "gpu_hour_price"),
        ({"currency": "usd"}, "currency"),
        ({"currency": "US"}, "currency"),
        ({"currency": "USDX"}, "currency"),
        ({"currency": None}, "currency"),
        ({"pools": {"h100": -0.01}}, "pools"),
        ({"pools": {"": 1}}, "pools"),
        ({"pools": {"a" * 65: 1}}, "pools"),
        ({"pools": {"bad\u0000pool": 1}}, "pools"),
        ({"pools": [1, 2]}, "pools"),
        ({"pools": None}, "pools"),
    ],
)
def test_invalid_prices_are_refused_with_a_400_naming_the_field(personas, change, field):
    priced(price="1")
    r = personas["admin"].client().put(URL, {**BODY, **change}, format="json")
    assert r.status_code == 400, r.content
    assert field in r.content.decode()
    east = Cluster.objects.get(name="east")
    assert east.gpu_hour_price == Decimal("1") and east.currency == "USD"  # nothing changed
    assert not NodePoolPrice.objects.exists()


def test_a_missing_field_or_cluster_is_a_4xx(personas):
    priced(price="1")
    admin = personas["admin"].client()
    for missing in ("gpu_hour_price", "currency", "pools"):
        body = {k: v for k, v in BODY.items() if k != missing}
        assert admin.put(URL, body, format="json").status_code == 400
    assert admin.put(URL, "[]", content_type="application/json").status_code == 400
    assert admin.put(URL, "{", content_type="application/json").status_code == 400
    assert admin.get("/api/v1/clusters/nowhere/pricing").status_code == 404
    assert admin.put("/api/v1/clusters/nowhere/pricing", BODY, format="json").status_code == 404


# --- the admin -------------------------------------------------------------------------


def test_the_admin_edits_prices_pools_inline_and_a_nodes_pool(client, django_user_model):
    east = priced(price=None)
    node = NodeFactory(cluster=east, name="n01")
    client.force_login(django_user_model.objects.create_superuser("root", "r@example.com", "x"))
    html = client.get(f"/admin/jobs/cluster/{east.pk}/change/").content.decode()
    assert 'name="gpu_hour_price"' in html and 'name="pool_prices-0-pool"' in html
    form = {
        "name": "east",
        "description": "",
        "gpu_hour_price": "2.5",
        "currency": "eur",
        "pool_prices-TOTAL_FORMS": "1",
        "pool_prices-INITIAL_FORMS": "0",
        "pool_prices-0-pool": "h100",
        "pool_prices-0-gpu_hour_price": "4",
    }
    r = client.post(f"/admin/jobs/cluster/{east.pk}/change/", form)
    assert r.status_code == 200 and "three capital letters" in r.content.decode()
    r = client.post(f"/admin/jobs/cluster/{east.pk}/change/", {**form, "currency": "EUR"})
    assert r.status_code == 302, r.content.decode()[:3000]
    east.refresh_from_db()
    assert (east.gpu_hour_price, east.currency) == (Decimal("2.5"), "EUR")
    assert east.pool_prices.get().gpu_hour_price == Decimal("4")
    r = client.post(
        f"/admin/jobs/cluster/{east.pk}/change/",
        {**form, "currency": "EUR", "pool_prices-0-gpu_hour_price": "-1"},
    )
    assert r.status_code == 200 and east.pool_prices.count() == 1  # refused
    html = client.get(f"/admin/jobs/node/{node.pk}/change/").content.decode()
    assert 'name="pool"' in html
    node_form = {"cluster": east.pk, "name": "n01", "state": "active", "registered": "on"}
    r = client.post(f"/admin/jobs/node/{node.pk}/change/", {**node_form, "pool": "bad pool"})
    assert r.status_code == 200 and "pool name" in r.content.decode()
    r = client.post(f"/admin/jobs/node/{node.pk}/change/", {**node_form, "pool": "h100"})
    assert r.status_code == 302
    node.refresh_from_db()
    assert node.pool == "h100"
