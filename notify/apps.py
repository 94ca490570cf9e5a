"""Notifications: who is told what, through which channel (webhook, Slack, PagerDuty,
e-mail), when incidents open and resolve and actions wait for a person or fail."""

from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "notify"
    verbose_name = "Notifications"

    def ready(self):
        from incidents.signals import incident_opened, incident_resolved
        from notify import receivers
        from recovery.signals import action_changed

        incident_opened.connect(receivers.on_incident_opened, dispatch_uid="notify.opened")
        incident_resolved.connect(receivers.on_incident_resolved, dispatch_uid="notify.resolved")
        action_changed.connect(receivers.on_action_changed, dispatch_uid="notify.action")
