"""Where an incident's time to recover went (recovery.selectors.phases): on the worked
example, with an approval and a driver run in it, and through the API and the page."""

from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.models import Action
from recovery.selectors import incident_phases, incidents_phases, phases_summary
from tests.factories import ActionAuditFactory, ActionFactory
from tests.incidents.conftest import detect

pytestmark = pytest.mark.django_db


def seconds(figures) -> dict:
    return {p["phase"]: p["seconds"] for p in figures["phases"]}


@pytest.fixture
def sample_incidents(ingest, sample):
    events, _ = sample
    assert ingest(events).status_code == 202
    return detect("sample-small")


def test_without_actions_the_phases_add_up_to_the_time_to_recover(sample_incidents):
    crash = sample_incidents[0]
    # The sample's crash: reported at once, launch 2 started 80 s later, restored its
    # checkpoint 40 s after that, and passed the step lost 37 s later.
    assert crash.relaunched_at.timestamp() == pytest.approx(1790000254.475347)
    assert crash.restored_at.timestamp() == pytest.approx(1790000294.475347)
    got = seconds(incident_phases(crash))
    assert got == pytest.approx(
        {
            "detecting": 0.0,
            "waiting_for_approval": 0.0,
            "queued": 0.0,
            "acting": 0.0,
            "relaunching": 80.0,
            "restarting": 40.0,
            "catching_up": 37.001038,
        },
        abs=1e-5,
    )
    for incident in sample_incidents:
        figures = incident_phases(incident)
        assert sum(figures["phases"][k]["seconds"] for k in range(7)) == pytest.approx(
            incident.time_to_recover_s
        )
        assert figures["people_s"] == 0.0
        assert figures["machines_s"] == pytest.approx(incident.time_to_recover_s)


T0 = timezone.now() - timedelta(hours=1)


def audit(action, *moves):
    """Audit entries of `action`: (seconds after T0, to_state)."""
    for after, state in moves:
        ActionAuditFactory(action=action, at=T0 + timedelta(seconds=after), to_state=state)


def test_an_approval_is_people_and_the_driver_is_machines(sample_incidents):
    crash = sample_incidents[0]
    action = ActionFactory(
        kind="restart_job", job=crash.job, incident=crash, state="succeeded", mode="approval"
    )
    audit(
        action,
        (0, "awaiting_approval"),
        (50, "approved"),
        (52, "queued"),
        (55, "running"),
        (70, "succeeded"),
    )
    figures = incident_phases(crash)
    got = seconds(figures)
    assert got["waiting_for_approval"] == pytest.approx(50)
    assert got["queued"] == pytest.approx(5)
    assert got["acting"] == pytest.approx(15)
    # Of the 80 s between detection and the relaunch, the actions explain 70.
    assert got["relaunching"] == pytest.approx(10)
    assert figures["people_s"] == pytest.approx(50)
    assert figures["people_s"] + figures["machines_s"] == pytest.approx(crash.time_to_recover_s)


def test_a_moment_two_actions_share_counts_once_and_people_first(sample_incidents):
    crash = sample_incidents[0]
    cordon = ActionFactory(kind="cordon_node", incident=crash, state="succeeded", mode="auto")
    replace = ActionFactory(
        kind="restart_job", job=crash.job, incident=crash, state="succeeded", mode="approval"
    )
    audit(cordon, (0, "proposed"), (1, "queued"), (2, "running"), (32, "succeeded"))
    # Waits for a person from 10 s to 200 s while the cordon runs to 32 s.
    audit(replace, (10, "awaiting_approval"), (200, "approved"), (200, "queued"))
    audit(replace, (201, "running"), (211, "succeeded"))
    got = seconds(incident_phases(crash))
    assert got["waiting_for_approval"] == pytest.approx(190)
    assert got["acting"] == pytest.approx(8 + 10)  # the cordon before the wait, the restart
    assert got["queued"] == pytest.approx(2 + 1)
    assert got["relaunching"] == 0.0  # the actions took longer than the gap: never negative


def test_an_action_still_waiting_counts_to_now(sample_incidents):
    crash = sample_incidents[0]
    action = ActionFactory(
        kind="restart_job", job=crash.job, incident=crash, state="awaiting_approval"
    )
    ActionAuditFactory(action=action, at=timezone.now() - timedelta(seconds=120))
    assert seconds(incident_phases(crash))["waiting_for_approval"] == pytest.approx(120, abs=5)


def test_an_incident_not_yet_recovered_has_phases_not_reached(personas):
    from tests.factories import IncidentFactory

    incident = IncidentFactory()
    got = seconds(incident_phases(incident))
    assert got["detecting"] == 0.0
    assert got["relaunching"] is None
    assert got["restarting"] is None
    assert got["catching_up"] is None


def test_many_incidents_take_a_fixed_number_of_queries(sample_incidents, django_assert_num_queries):
    for incident in sample_incidents:
        action = ActionFactory(
            kind="restart_job", job=incident.job, incident=incident, state="succeeded"
        )
        audit(action, (0, "proposed"), (3, "queued"), (4, "running"), (9, "succeeded"))
    with django_assert_num_queries(1):
        phases = incidents_phases(sample_incidents)
    assert all(seconds(p)["acting"] == pytest.approx(5) for p in phases.values())
    summary = phases_summary(sample_incidents)
    means = {p["phase"]: p for p in summary["phases"]}
    assert means["acting"]["mean_s"] == pytest.approx(5)
    assert means["restarting"]["incidents"] == 3
    assert summary["people_share"] == 0.0


def test_the_api_answers_an_incidents_phases_and_a_periods_means(sample_incidents, personas):
    viewer = personas["viewer"].client()
    crash = sample_incidents[0]
    answer = viewer.get(f"/api/v1/incidents/{crash.pk}/phases")
    assert answer.status_code == 200
    body = answer.json()
    assert body["incident"] == crash.pk
    assert [p["phase"] for p in body["phases"]][-1] == "catching_up"
    assert body["time_to_recover_s"] == pytest.approx(crash.time_to_recover_s)
    assert viewer.get("/api/v1/incidents/999999/phases").status_code == 404

    answer = viewer.get(
        "/api/v1/reliability/phases",
        {"cluster": crash.cluster.name, "start": 1789999000, "end": 1790001000},
    )
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["incidents"] == 3
    assert {p["phase"]: p["incidents"] for p in body["phases"]}["restarting"] == 3
    refused = viewer.get("/api/v1/reliability/phases", {"start": 10, "end": 5})
    assert refused.status_code == 400
    assert refused.json()["field"] == "end"
    assert personas["outsider"].client().get("/api/v1/reliability/phases").status_code == 403


def test_the_incident_page_shows_where_the_time_went(sample_incidents, personas, client):
    crash = sample_incidents[0]
    action = ActionFactory(kind="restart_job", job=crash.job, incident=crash, state="succeeded")
    audit(action, (0, "awaiting_approval"), (125, "approved"), (125, "queued"))
    client.force_login(personas["viewer"].user)
    page = client.get(f"/incidents/{crash.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Where the time to recover went" in html
    assert 'data-phase="waiting_for_approval"' in html
    assert "People (waiting for approval): <b>2 min 05 s</b>" in html


def test_action_states_the_phases_know_are_the_active_ones():
    from recovery.selectors.phases import STATE_PHASE

    assert set(STATE_PHASE) == set(Action.ACTIVE_STATES)
