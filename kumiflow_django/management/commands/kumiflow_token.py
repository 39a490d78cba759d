"""``manage.py kumiflow_token``: create, list and revoke API tokens.

The secret is printed once, by ``create``; only its hash is stored.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from kumiflow_django.http.models import ApiToken
from kumiflow_django.http.tokens import API_PERMISSIONS, create_token, revoke_token


class Command(BaseCommand):
    help = "Create, list and revoke tokens of the HTTP API."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="operation", required=True)
        create = sub.add_parser("create", help="Create a token and print it (once).")
        create.add_argument("--name", required=True, help="A unique name, shown in the admin.")
        create.add_argument(
            "--perm",
            action="append",
            default=[],
            dest="perms",
            help=f"A permission (repeat for more): {', '.join(API_PERMISSIONS)}; "
            "the kumiflow. prefix may be left out.",
        )
        create.add_argument("--tenant", help="The one tenant it sees (default: the default).")
        create.add_argument("--expires-in-days", type=float, help="Expire after this many days.")
        sub.add_parser("list", help="List the tokens (never their secrets).")
        revoke = sub.add_parser("revoke", help="Delete a token: it stops working at once.")
        revoke.add_argument("name")

    def handle(self, *args: Any, operation: str, **options: Any) -> None:
        if operation == "create":
            self._create(**options)
        elif operation == "list":
            for token in ApiToken.objects.order_by("name"):
                expires = token.expires_at.isoformat() if token.expires_at else "never"
                self.stdout.write(
                    f"{token.name}\ttenant={token.tenant_id}\t"
                    f"perms={','.join(token.permissions)}\texpires={expires}"
                )
        elif not revoke_token(options["name"]):
            raise CommandError(f"no token named {options['name']!r}")
        else:
            self.stdout.write(f"revoked {options['name']}")

    def _create(
        self,
        *,
        name: str,
        perms: list[str],
        tenant: str | None,
        expires_in_days: float | None,
        **options: Any,
    ) -> None:
        if not perms:
            raise CommandError("give at least one --perm")
        expires = None
        if expires_in_days is not None:
            if expires_in_days <= 0:
                raise CommandError("--expires-in-days must be positive")
            expires = timezone.now() + timedelta(days=expires_in_days)
        try:
            token, secret = create_token(name, permissions=perms, tenant=tenant, expires_at=expires)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stderr.write(
            f"Created token {token.name!r} for tenant {token.tenant_id!r} "
            f"({', '.join(token.permissions)}). It is shown this once:"
        )
        self.stdout.write(secret)
