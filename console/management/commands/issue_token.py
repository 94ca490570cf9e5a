from django.core.management.base import BaseCommand, CommandError

from console.models import ApiToken
from console.services import RoleError, token_issue


class Command(BaseCommand):
    help = "Issue an API token and print it alone on stdout (it is shown only once)."

    def add_arguments(self, parser):
        parser.add_argument("--scope", required=True, choices=ApiToken.Scope.values)
        parser.add_argument(
            "--cluster", help="the cluster an ingest token posts for (created if missing)"
        )
        parser.add_argument("--user", help="the existing user the token acts as")
        parser.add_argument("--name", default="", help="a label to tell tokens apart")

    def handle(self, *args, **opts):
        try:
            _, raw = token_issue(
                scope=opts["scope"],
                cluster_name=opts["cluster"],
                username=opts["user"],
                name=opts["name"],
            )
        except RoleError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(raw)
