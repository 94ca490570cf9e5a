from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from console.roles import ROLE_ORDER
from console.services import user_set_role


class Command(BaseCommand):
    help = "Give a user a role for the console and API: viewer, operator or admin (or none)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("role", choices=[*ROLE_ORDER, "none"])
        parser.add_argument("--create", action="store_true", help="create the user (no password)")

    def handle(self, *args, **opts):
        User = get_user_model()
        user = User.objects.filter(username=opts["username"]).first()
        if user is None:
            if not opts["create"]:
                raise CommandError(f"no user named {opts['username']!r} (use --create)")
            user = User.objects.create_user(opts["username"])
        user_set_role(user=user, role=None if opts["role"] == "none" else opts["role"])
        self.stdout.write(f"{user.username}: {opts['role']}")
