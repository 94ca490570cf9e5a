import sys

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from console.roles import ROLE_ORDER
from console.services import user_set_password, user_set_role


class Command(BaseCommand):
    help = (
        "Give a user a role for the console and API: viewer, operator or admin (or none)."
        " With --password-stdin, also set their password (read from the first line of"
        " stdin), so they can sign in: printf '%s\\n' \"$PW\" | manage.py set_role"
        " alice operator --create --password-stdin"
    )

    stealth_options = ("stdin",)  # for call_command(..., stdin=...)

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("role", choices=[*ROLE_ORDER, "none"])
        parser.add_argument("--create", action="store_true", help="create the user when missing")
        parser.add_argument(
            "--password-stdin",
            action="store_true",
            help="set the user's password from the first line of stdin (checked by the"
            " password validators); without it a new user has no password and cannot"
            " sign in until one is set (this, or manage.py changepassword USER)",
        )

    def handle(self, *args, **opts):
        password = None
        if opts["password_stdin"]:
            stdin = opts.get("stdin") or sys.stdin
            password = stdin.readline().rstrip("\r\n")
            if not password:
                raise CommandError("the password read from stdin is empty")
        User = get_user_model()
        with transaction.atomic():
            user = User.objects.filter(username=opts["username"]).first()
            if user is None:
                if not opts["create"]:
                    raise CommandError(f"no user named {opts['username']!r} (use --create)")
                user = User.objects.create_user(opts["username"])
            if password is not None:
                try:
                    user_set_password(user=user, password=password)
                except ValidationError as exc:
                    raise CommandError("password refused: " + " ".join(exc.messages)) from exc
            user_set_role(user=user, role=None if opts["role"] == "none" else opts["role"])
        self.stdout.write(
            f"{user.username}: {opts['role']}" + (", password set" if password else "")
        )
