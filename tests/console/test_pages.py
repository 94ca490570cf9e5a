"""The server-rendered pages: who may see them, and that they show the ledger."""

import pytest

from jobs.models import TrainingJob

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(db):
    from django.core.management import call_command

    call_command("seed_demo", verbosity=0)
    return TrainingJob.objects.get(key="demo-llm")


@pytest.mark.parametrize("persona", ["viewer", "operator", "admin"])
def test_roles_see_the_jobs_and_their_ledger(client, personas, demo, persona):
    client.force_login(personas[persona].user)
    r = client.get("/jobs/")
    assert r.status_code == 200
    html = r.content.decode()
    assert "demo-llm" in html and "Goodput (time)" in html
    r = client.get("/jobs/demo-llm/")
    assert r.status_code == 200
    html = r.content.decode()
    for label in ("productive", "wasted progress", "checkpoint restore", "downtime", "GPU-hours"):
        assert label in html
    assert html.count("<tr><td>") >= 4 + 8  # launches and checkpoints rows


def test_strangers_are_sent_to_sign_in(client, demo):
    r = client.get("/")
    assert r.status_code == 302 and "/login/" in r["Location"]


def test_users_without_a_role_are_refused(client, personas, demo):
    client.force_login(personas["outsider"].user)
    assert client.get("/").status_code == 403
    assert client.get("/jobs/demo-llm/").status_code == 403


def test_unknown_job_page_is_404(client, personas):
    client.force_login(personas["viewer"].user)
    assert client.get("/jobs/nope/").status_code == 404


def test_pages_load_no_third_party_assets(client, personas, demo):
    client.force_login(personas["viewer"].user)
    html = client.get("/jobs/demo-llm/").content.decode()
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html


def test_admin_lists_jobs_and_tokens(client, personas, demo):
    personas["admin"].user.is_staff = personas["admin"].user.is_superuser = True
    personas["admin"].user.save()
    client.force_login(personas["admin"].user)
    assert b"demo-llm" in client.get("/admin/jobs/trainingjob/").content
    page = client.get("/admin/console/apitoken/").content.decode()
    assert "rbd_" in page  # the hints
    assert client.get("/admin/console/apitoken/add/").status_code == 403
