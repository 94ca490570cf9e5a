"""Notifications: who is told what, through which channel (webhook, Slack, PagerDuty,
e-mail), when incidents open and resolve and actions wait for a person or fail."""
