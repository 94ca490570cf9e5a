from django.core.management.base import BaseCommand

from jobs.demo import demo_events
from jobs.services import cluster_get_or_create, events_ingest
from jobs.wire import validate_events


class Command(BaseCommand):
    help = "Ingest a demo job (a crash, a rollback, a smaller relaunch) so the console has numbers."

    def add_arguments(self, parser):
        parser.add_argument("--cluster", default="demo")
        parser.add_argument("--job", default="demo-llm")

    def handle(self, *args, **opts):
        cluster = cluster_get_or_create(name=opts["cluster"])
        raw = demo_events(job=opts["job"])
        accepted = duplicates = 0
        for i in range(0, len(raw), 1000):
            events, errors = validate_events(raw[i : i + 1000], 5000)
            assert not errors, errors
            result = events_ingest(cluster=cluster, events=events)
            accepted += result.accepted
            duplicates += result.duplicates
        self.stdout.write(
            f"demo job {opts['job']}: {accepted} events stored, {duplicates} already there"
        )
