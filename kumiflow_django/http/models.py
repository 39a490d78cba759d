"""API tokens: who may call the HTTP API without a session, for which tenant, with which rights.

Only a SHA-256 hash of a token is stored. Tokens are long random strings
(256 bits), so a fast hash is enough: nobody can guess one from its hash,
and a lookup by hash is a single indexed read per request.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class ApiTokenQuerySet(models.QuerySet["ApiToken", "ApiToken"]):
    def usable(self) -> ApiTokenQuerySet:
        """Tokens that have not expired (revoked tokens are deleted)."""
        return self.filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=timezone.now())
        )


class ApiToken(models.Model):
    name = models.CharField(_("name"), max_length=100)
    key_hash = models.CharField(_("SHA-256 of the token"), max_length=64, editable=False)
    permissions = models.JSONField(_("permissions"), default=list)
    tenant_id = models.CharField(_("tenant"), max_length=64)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    last_used_at = models.DateTimeField(_("last used at"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)

    objects: ClassVar[ApiTokenQuerySet] = ApiTokenQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "kumiflow"
        verbose_name = _("API token")
        verbose_name_plural = _("API tokens")
        # The rights of the HTTP API that the app's models do not define yet;
        # kept here so that the API's permissions are all "kumiflow.<codename>".
        permissions = [
            ("start_workflowrun", "Can start workflow runs"),
            ("append_event", "Can append events"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["name"], name="kumiflow_apitoken_name_uq"),
            # Also the index of the one lookup a request makes.
            models.UniqueConstraint(fields=["key_hash"], name="kumiflow_apitoken_hash_uq"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.tenant_id})"
