"""Put nodes of a cluster in a state (creating them when asked), e.g. register spares:

manage.py set_node_state --cluster local --create spare node-d
manage.py set_node_state --cluster local --pool h100 active node-a node-b  # and their pool
"""

from django.core.management.base import BaseCommand, CommandError

from common.errors import Invalid
from jobs.models import Node
from jobs.services import cluster_get_or_create, node_set_pool, node_set_state
from jobs.services.pricing import pool_check


class Command(BaseCommand):
    help = "Set the state of nodes of a cluster (e.g. register spares)."

    def add_arguments(self, parser):
        parser.add_argument("state", choices=Node.State.values)
        parser.add_argument("nodes", nargs="+")
        parser.add_argument("--cluster", required=True)
        parser.add_argument("--create", action="store_true", help="create missing nodes")
        parser.add_argument(
            "--pool", help="put the nodes in this node pool (for its price); '' takes them out"
        )

    def handle(self, *args, **o):
        if o["pool"]:
            try:
                pool_check(o["pool"])
            except Invalid as exc:
                raise CommandError(exc.detail) from exc
        cluster = cluster_get_or_create(name=o["cluster"])
        for name in o["nodes"]:
            node = Node.objects.filter(cluster=cluster, name=name).first()
            if node is None:
                if not o["create"]:
                    raise CommandError(f"no node {name} on {cluster.name} (use --create)")
                node = Node.objects.create(cluster=cluster, name=name, state=o["state"])
            node_set_state(node_id=node.pk, to=o["state"])
            said = o["state"]
            if o["pool"] is not None:
                node_set_pool(node_id=node.pk, pool=o["pool"])
                said += f", pool {o['pool'] or '(none)'}"
            self.stdout.write(f"{cluster.name}/{name}: {said}")
