"""Sending: HTTP POSTs of JSON with short timeouts (urllib: no extra dependency), the
webhook's signature, and e-mail through django.core.mail. Each send answers a
`Sent` (HTTP status or error); nothing here touches the database."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from django.conf import settings
from django.core import mail

USER_AGENT = "Rebound-Notify/1"
# 4xx answers that may succeed when sent again; any other 4xx is the message's or the
# channel's fault (a bad routing key, a deleted Slack hook): retrying will not help.
RETRYABLE_4XX = frozenset({408, 425, 429})


@dataclass
class Sent:
    ok: bool
    http_status: int | None = None
    error: str = ""
    permanent: bool = False  # not worth another attempt

    @classmethod
    def from_error(cls, error: str, *, permanent: bool = False) -> Sent:
        return cls(False, None, error[:2000], permanent)


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The webhook signature: hex HMAC-SHA256 of `timestamp + "." + body` under `secret`."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def post_json(url: str, payload: dict, *, secret: str = "", event: str = "") -> Sent:
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    if event:
        headers["X-Rebound-Event"] = event
    if secret:
        timestamp = str(int(time.time()))
        headers["X-Rebound-Timestamp"] = timestamp
        headers["X-Rebound-Signature"] = sign(secret, timestamp, body)
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=settings.REBOUND_NOTIFY_HTTP_TIMEOUT_S) as r:
            r.read(65536)
            return Sent(True, r.status)
    except urllib.error.HTTPError as exc:
        detail = exc.read(500).decode("utf-8", "replace").strip()
        permanent = 400 <= exc.code < 500 and exc.code not in RETRYABLE_4XX
        return Sent(False, exc.code, f"HTTP {exc.code}: {detail}"[:2000], permanent)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Sent.from_error(f"{type(exc).__name__}: {reason}")


def send_email(subject: str, body: str, to: list[str]) -> Sent:
    try:
        mail.send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, to, fail_silently=False)
    except (OSError, mail.BadHeaderError) as exc:  # smtplib's errors are OSErrors
        return Sent.from_error(f"{type(exc).__name__}: {exc}")
    return Sent(True)
