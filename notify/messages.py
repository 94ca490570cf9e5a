"""What a notification says, per channel kind: the items (one per incident or action,
each with its deep link into the console) and the generic webhook, Slack, PagerDuty
Events API v2 and e-mail forms of the message. Read-only; docs/notifications.md
documents each schema.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from incidents.costs import attach_costs
from incidents.models import Incident
from notify.models import Event, Notification
from recovery.models import Action

VERSION = 1
SLACK_ITEMS = 10  # Slack allows 50 blocks; a storm's message lists the first ones

TITLES = {
    Event.INCIDENT_OPENED: "Incident opened",
    Event.INCIDENT_RESOLVED: "Incident resolved",
    Event.APPROVAL_WAITING: "Action awaiting approval",
    Event.APPROVAL_EXPIRING: "Approval about to expire",
    Event.ACTION_FAILED: "Action failed",
    Event.STORM_TRIPPED: "Storm guardrail tripped: automatic isolation held",
    Event.TEST: "Test message",
}
PLURAL = {
    Event.INCIDENT_OPENED: "incidents opened",
    Event.INCIDENT_RESOLVED: "incidents resolved",
    Event.APPROVAL_WAITING: "actions awaiting approval",
    Event.APPROVAL_EXPIRING: "approvals about to expire",
    Event.ACTION_FAILED: "actions failed",
    Event.STORM_TRIPPED: "actions held by the storm guardrail",
}
# Rebound's incident severities to PagerDuty's.
PD_SEVERITY = {"critical": "critical", "major": "error", "minor": "warning"}
PD_EVENT_SEVERITY = {
    Event.ACTION_FAILED: "error",
    Event.APPROVAL_WAITING: "warning",
    Event.APPROVAL_EXPIRING: "warning",
    Event.STORM_TRIPPED: "critical",
    Event.TEST: "info",
}


def public_url(path: str) -> str:
    return settings.REBOUND_PUBLIC_URL.rstrip("/") + path


def incident_dedup_key(incident_id: int) -> str:
    return f"rebound-incident-{incident_id}"


def _iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def incident_item(incident: Incident) -> dict:
    """An incident as every message lists it: the one place its fields are chosen.
    `incident.lost_cost` (incidents.costs.attach_costs) is its lost compute in money:
    null where its cluster has no price per GPU-hour."""
    cost = getattr(incident, "lost_cost", None)
    return {
        "type": "incident",
        "id": incident.pk,
        "cluster": incident.cluster.name,
        "job": incident.job.key,
        "cause": incident.cause,
        "fault_type": incident.fault_type,
        "severity": incident.severity,
        "state": incident.state,
        "summary": incident.summary,
        "nodes": sorted(n.name for n in incident.nodes.all()),
        "fault_at": _iso(incident.fault_at),
        "detected_at": _iso(incident.detected_at),
        "opened_at": _iso(incident.opened_at),
        "resolved_at": _iso(incident.resolved_at),
        "lost_gpu_hours": round(incident.lost_gpu_hours, 3),
        "lost_cost": None if cost is None else float(cost.amount),
        "currency": None if cost is None else cost.currency,
        "url": public_url(f"/incidents/{incident.pk}/"),
    }


def action_item(action: Action) -> dict:
    return {
        "type": "action",
        "id": action.pk,
        "kind": action.kind,
        "state": action.state,
        "cluster": action.cluster.name,
        "node": action.node.name if action.node_id else None,
        "job": action.job.key if action.job_id else None,
        "incident": action.incident_id,
        "reason": action.reason,
        "requested_by": action.requested_by,
        "blocked_by": action.blocked_by,
        "blocked_reason": action.blocked_reason,
        "expires_at": _iso(action.expires_at),
        "error": action.error,
        "url": public_url(f"/approvals/#action-{action.pk}"),
        "incident_url": public_url(f"/incidents/{action.incident_id}/")
        if action.incident_id
        else None,
    }


@dataclass
class Message:
    """A notification's content, read when it is delivered (the rows as they are then)."""

    notification: Notification
    items: list[dict]
    incidents: list[Incident]
    sent_at: str

    @property
    def event(self) -> str:
        return self.notification.event

    @property
    def cluster(self) -> str | None:
        n = self.notification
        return n.cluster.name if n.cluster_id else None

    @property
    def title(self) -> str:
        n, count = self.notification, len(self.items)
        where = f" on {self.cluster}" if self.cluster else ""
        if count > 1:
            return f"{count} {PLURAL[n.event]}{where}"
        if not self.items:
            return f"Rebound: {TITLES[n.event]}" + (f" ({n.channel.name})" if n.channel_id else "")
        item = self.items[0]
        return f"{TITLES[n.event]}{where}: {_line(item)}"

    @property
    def link(self) -> str:
        if self.items:
            if len(self.items) > 1 and self.items[0]["type"] == "action":
                return public_url("/approvals/")
            if len(self.items) > 1:
                return public_url(f"/incidents/?cluster={self.cluster}")
            return self.items[0]["url"]
        return public_url("/")


def _line(item: dict) -> str:
    if item["type"] == "incident":
        return (
            f"#{item['id']} {item['summary']} ({item['cause']}, {item['severity']},"
            f" job {item['job']}, {item['lost_gpu_hours']:g} GPU-h{_money(item)} lost)"
        )
    target = (
        ", ".join(f"{k} {item[k]}" for k in ("node", "job") if item.get(k))
        or f"cluster {item['cluster']}"
    )
    why = item["error"] or item["blocked_reason"] or item["reason"]
    return f"action #{item['id']} {item['kind']} ({target}), {item['state']}" + (
        f": {why}" if why else ""
    )


def _money(item: dict) -> str:
    if item.get("lost_cost") is None:
        return ""
    return f" = {item['lost_cost']:,.2f} {item['currency']}"


def message_build(notification: Notification) -> Message:
    incident_ids = [s["incident"] for s in notification.subjects if "incident" in s]
    action_ids = [s["action"] for s in notification.subjects if "action" in s]
    incidents = (
        Incident.objects.select_related("job", "cluster").prefetch_related("nodes")
    ).in_bulk(incident_ids)
    attach_costs(incidents.values())
    actions = Action.objects.select_related("cluster", "node", "job").in_bulk(action_ids)
    items, kept = [], []
    for s in notification.subjects:
        if "incident" in s and s["incident"] in incidents:
            kept.append(incidents[s["incident"]])
            items.append(incident_item(kept[-1]))
        elif "action" in s and s["action"] in actions:
            items.append(action_item(actions[s["action"]]))
    return Message(notification, items, kept, _iso(timezone.now()))


# --- the forms, per channel kind ---------------------------------------------------


def webhook_body(m: Message) -> dict:
    return {
        "version": VERSION,
        "event": m.event,
        "sent_at": m.sent_at,
        "cluster": m.cluster,
        "notification": m.notification.pk,
        "title": m.title,
        "url": m.link,
        "count": len(m.items),
        "items": m.items,
        "detail": m.notification.detail,
    }


def slack_body(m: Message) -> dict:
    text = f"{m.title} <{m.link}|Open in Rebound>"
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": f"*{_esc(m.title)}*"}}]
    for item in m.items[:SLACK_ITEMS]:
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": f"<{item['url']}|{_esc(_line(item))}>"},
            }
        )
    rest = len(m.items) - SLACK_ITEMS
    footer = (
        f"and {rest} more: <{m.link}|all in Rebound>" if rest > 0 else f"<{m.link}|Open in Rebound>"
    )
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": footer}]})
    return {"text": text, "blocks": blocks}


def _esc(text: str) -> str:
    """Slack's mrkdwn escapes: &, < and > only."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def pagerduty_events(m: Message, routing_key: str) -> list[dict]:
    """The Events API v2 events of the message. A trigger per message: an incident
    group's uses its first incident's dedup key and lists the rest; a resolve per
    incident, with that incident's key (an incident that joined another's trigger has
    no alert of its own: PagerDuty accepts and ignores its resolve)."""
    n = m.notification
    if n.event == Event.INCIDENT_RESOLVED:
        return [
            {
                "routing_key": routing_key,
                "event_action": "resolve",
                "dedup_key": incident_dedup_key(i["id"]),
            }
            for i in m.items
        ]
    first = m.items[0] if m.items else None
    if n.event == Event.INCIDENT_OPENED and first:
        dedup_key = incident_dedup_key(first["id"])
        worst = min((i["severity"] for i in m.items), key=["critical", "major", "minor"].index)
        severity = PD_SEVERITY.get(worst, "error")
    else:
        anchor = f"action-{first['id']}" if first else f"notification-{n.pk}"
        dedup_key = f"rebound-{n.event.replace('_', '-')}-{anchor}"
        severity = PD_EVENT_SEVERITY.get(n.event, "warning")
    return [
        {
            "routing_key": routing_key,
            "event_action": "trigger",
            "dedup_key": dedup_key,
            "payload": {
                "summary": m.title[:1024],
                "source": m.cluster or "rebound",
                "severity": severity,
                "timestamp": (first or {}).get("detected_at") or m.sent_at,
                "component": (first or {}).get("job") or (first or {}).get("node") or "",
                "group": m.cluster or "",
                "class": (first or {}).get("cause") or (first or {}).get("kind") or n.event,
                "custom_details": {
                    "event": n.event,
                    "count": len(m.items),
                    "items": m.items,
                    "others": [incident_dedup_key(i["id"]) for i in m.items[1:]]
                    if n.event == Event.INCIDENT_OPENED
                    else [],
                    **n.detail,
                },
            },
            "links": [{"href": m.link, "text": "Open in Rebound"}]
            + [{"href": i["url"], "text": f"{i['type']} #{i['id']}"} for i in m.items[1:10]],
        }
    ]


def email_message(m: Message) -> tuple[str, str]:
    """(subject, plain-text body)."""
    lines = [m.title, "", m.link, ""]
    for item in m.items:
        lines += [f"- {_line(item)}", f"  {item['url']}"]
    if m.notification.detail.get("why"):
        lines += ["", m.notification.detail["why"]]
    lines += ["", f"Sent by Rebound at {m.sent_at}."]
    subject = " ".join(f"[Rebound] {m.title}".split())  # no line breaks in a header
    return subject[:200], "\n".join(lines)
