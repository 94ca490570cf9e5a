"""Choose the driver that carries out a cluster's recovery actions.

manage.py set_cluster_driver --cluster demo noop
manage.py set_cluster_driver --cluster east slurm --option slurm_conf=/etc/slurm/slurm.conf
"""

from django.core.management.base import BaseCommand, CommandError

from jobs.services import cluster_get_or_create
from recovery.drivers import DRIVERS
from recovery.models import ClusterRecoverySettings


class Command(BaseCommand):
    help = "Set a cluster's recovery driver (and its options, NAME=VALUE)."

    def add_arguments(self, parser):
        parser.add_argument("driver", choices=sorted(DRIVERS))
        parser.add_argument("--cluster", required=True)
        parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE")

    def handle(self, *args, **o):
        options = {}
        for item in o["option"]:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise CommandError(f"--option takes NAME=VALUE, not {item!r}")
            options[name] = value
        cluster = cluster_get_or_create(name=o["cluster"])
        ClusterRecoverySettings.objects.update_or_create(
            cluster=cluster, defaults={"driver": o["driver"], "driver_options": options}
        )
        self.stdout.write(f"{cluster.name}: recovery through the {o['driver']} driver")
