"""The incidents app's config: it connects the receivers of the jobs app's signals."""

from django.apps import AppConfig


class IncidentsConfig(AppConfig):
    name = "incidents"

    def ready(self):
        from incidents.receivers import on_events_stored, on_ledger_refreshed
        from jobs.signals import events_stored, ledger_refreshed

        events_stored.connect(on_events_stored, dispatch_uid="incidents.on_events_stored")
        ledger_refreshed.connect(on_ledger_refreshed, dispatch_uid="incidents.on_ledger_refreshed")
