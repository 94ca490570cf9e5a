from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    name = "recovery"

    def ready(self):
        from incidents.signals import incident_opened, incident_updated
        from jobs.signals import events_stored, maintenance_changed
        from recovery import receivers

        incident_opened.connect(
            receivers.on_incident_opened, dispatch_uid="recovery.on_incident_opened"
        )
        incident_updated.connect(
            receivers.on_incident_updated, dispatch_uid="recovery.on_incident_updated"
        )
        events_stored.connect(receivers.on_events_stored, dispatch_uid="recovery.on_events_stored")
        maintenance_changed.connect(
            receivers.on_maintenance_changed, dispatch_uid="recovery.on_maintenance_changed"
        )
