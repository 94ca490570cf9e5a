"""The incidents app's config: it connects the receivers of the jobs app's signals."""

from django.apps import AppConfig


class IncidentsConfig(AppConfig):
    name = "incidents"

    def ready(self):
        from incidents.receivers import (
            on_events_stored,
            on_ledger_refreshed,
            on_maintenance_changed,
        )
        from jobs.signals import events_stored, ledger_refreshed, maintenance_changed

        events_stored.connect(on_events_stored, dispatch_uid="incidents.on_events_stored")
        ledger_refreshed.connect(on_ledger_refreshed, dispatch_uid="incidents.on_ledger_refreshed")
        maintenance_changed.connect(
            on_maintenance_changed, dispatch_uid="incidents.on_maintenance_changed"
        )
