"""Notifications: what recording an event and delivering a message cost.

    .venv/bin/python bench/notifications.py [--events 500] [--deliveries 200]
        [--database-url postgres://postgres@127.0.0.1:5432/rebound_bench_notify]

In this process, on a database of its own (created and migrated; its notify rows and
the bench's cluster are deleted first): three rules on a webhook channel pointing at a
local HTTP receiver (http.server in a thread, answering 200).

1. A storm: `--events` incidents opened on one cluster, each announced as the
   incidents app does (the signal). Prints the cost of one event (p50, p95: rule
   matching, joining the group, its outbox row) and how many messages it made (one
   per rule, whatever the count).
2. One of those grouped messages delivered: its build and post time and body size.
3. `--deliveries` single-incident messages delivered one after another: the time of
   one delivery (claim, message, HTTP post, attempt and timeline records).
"""

import argparse
import http.server
import statistics
import threading
import time

from harness import setup_django

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/rebound_bench_notify"


def receiver() -> tuple[str, list[int]]:
    sizes: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            sizes.append(len(self.rfile.read(int(self.headers.get("Content-Length") or 0))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}/hook", sizes


def ms(values: list[float]) -> str:
    values = sorted(values)
    p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
    return f"p50 {statistics.median(values) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--deliveries", type=int, default=200)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    args = parser.parse_args()
    setup_django(args.database_url)

    from django.utils import timezone

    from incidents.models import Incident
    from incidents.signals import incident_opened
    from jobs.models import Cluster, TrainingJob
    from notify import services
    from notify.models import Channel, Notification, Rule

    def cleanup():
        TrainingJob.objects.filter(key="bench-notify-job").delete()
        Cluster.objects.filter(name="bench-notify").delete()

    Notification.objects.all().delete()
    Rule.objects.all().delete()
    Channel.objects.all().delete()
    cleanup()
    cluster = Cluster.objects.create(name="bench-notify")
    job = TrainingJob.objects.create(key="bench-notify-job", cluster=cluster)
    url, sizes = receiver()
    channel = Channel.objects.create(
        name="bench", kind="webhook", url=url, secret="k", rate_limit_per_minute=0
    )
    Rule.objects.create(name="all", channel=channel)
    Rule.objects.create(name="gpu", channel=channel, causes=["gpu"])
    Rule.objects.create(name="critical", channel=channel, severities=["critical"])

    def incident(i: int) -> Incident:
        now = timezone.now()
        return Incident.objects.create(
            job=job, cluster=cluster, detector="bench", episode=f"e{i}", cause="gpu",
            fault_type="gpu_xid", severity="critical", summary=f"Xid 79 on g{i:04d}",
            fault_at=now, detected_at=now, lost_gpu_seconds=3600.0,
        )  # fmt: skip

    costs = []
    for i in range(args.events):
        row = incident(i)
        t = time.perf_counter()
        incident_opened.send(sender=Incident, incident=row)
        costs.append(time.perf_counter() - t)
    made = Notification.objects.count()
    print(f"storm: {args.events} incidents opened, 3 rules: {made} messages")
    print(f"  recording one event: {ms(costs)}")

    group = Notification.objects.order_by("id").first()
    t = time.perf_counter()
    result = services.notification_deliver(notification_id=group.pk, now=group.next_attempt_at)
    took = time.perf_counter() - t
    print(
        f"  one grouped message of {len(group.subjects)} incidents: {result.outcome},"
        f" {took * 1000:.0f} ms, body {sizes[-1] / 1024:.0f} KiB"
        f" (and {len(group.subjects)} timeline entries)"
    )
    Notification.objects.all().delete()
    Rule.objects.exclude(name="all").delete()

    Rule.objects.filter(name="all").update(group_window_s=0)
    times = []
    for i in range(args.deliveries):
        incident_opened.send(sender=Incident, incident=incident(args.events + i))
        n = Notification.objects.get(state="pending")
        t = time.perf_counter()
        result = services.notification_deliver(notification_id=n.pk)
        times.append(time.perf_counter() - t)
        assert result.outcome == "sent", result
    print(f"deliveries: {args.deliveries} single-incident webhook messages, one at a time")
    print(f"  one delivery (claim, build, post, records): {ms(times)}")
    cleanup()


if __name__ == "__main__":
    main()
