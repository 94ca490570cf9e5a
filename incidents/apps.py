from django.apps import AppConfig


class IncidentsConfig(AppConfig):
    name = "incidents"

    def ready(self):
        from incidents.receivers import on_events_stored
        from jobs.signals import events_stored

        events_stored.connect(on_events_stored, dispatch_uid="incidents.on_events_stored")
