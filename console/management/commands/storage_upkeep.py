import json

from django.core.management.base import BaseCommand

from incidents.upkeep import incidents_storage_upkeep


class Command(BaseCommand):
    help = (
        "Run storage upkeep once (what the worker's beat runs every REBOUND_UPKEEP_EVERY_S):"
        " roll heartbeat buckets and rank windows past their horizons up, drop the raw"
        " events of rank windows no client will send again; print what it did."
    )

    def handle(self, *args, **options):
        run = incidents_storage_upkeep()
        took = (run.finished_at - run.started_at).total_seconds()
        self.stdout.write(json.dumps({**run.report, "took_s": round(took, 3)}, indent=2))
