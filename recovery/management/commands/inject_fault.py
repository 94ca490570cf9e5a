"""Inject a fault on a lab cluster (the `local` driver): see recovery.faults.FAULTS.

manage.py inject_fault crash --cluster local --job demo-live-20261201-091500 --rank 1
manage.py inject_fault xid --cluster local --node node-b --xid 79 --kill
"""

import json

from django.core.management.base import BaseCommand, CommandError

from jobs.models import Cluster
from recovery.errors import FaultInvalid, FaultRefused
from recovery.faults import FAULTS, fault_inject


class Command(BaseCommand):
    help = "Inject a fault on a lab cluster: " + ", ".join(
        f"{k} ({f.what})" for k, f in FAULTS.items()
    )

    def add_arguments(self, parser):
        parser.add_argument("kind", choices=list(FAULTS))
        parser.add_argument("--cluster", default="local")
        parser.add_argument("--job")
        parser.add_argument("--rank", type=int)
        parser.add_argument("--node")
        parser.add_argument("--factor", type=float)
        parser.add_argument("--xid", type=int)
        parser.add_argument("--from-step", type=int)
        parser.add_argument("--kill", action="store_true", help="xid: its ranks die too")

    def handle(self, *args, **o):
        cluster = Cluster.objects.filter(name=o["cluster"]).first()
        if cluster is None:
            raise CommandError(f"no cluster {o['cluster']}")
        try:
            done = fault_inject(
                cluster=cluster,
                kind=o["kind"],
                actor="manage.py inject_fault",
                job=o["job"],
                rank=o["rank"],
                node=o["node"],
                factor=o["factor"],
                xid=o["xid"],
                from_step=o["from_step"],
                kill=o["kill"],
            )
        except (FaultInvalid, FaultRefused) as exc:
            raise CommandError(exc.detail) from exc
        self.stdout.write(json.dumps(done))
