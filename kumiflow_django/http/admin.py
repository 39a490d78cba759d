"""API tokens in the admin: read-only, because a token's secret exists only once.

Tokens are created with ``manage.py kumiflow_token create``, which prints
the secret once; the admin lists them and revokes them (delete).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from kumiflow_django.http.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "tenant_id",
        "permission_list",
        "created_at",
        "last_used_at",
        "expires_at",
    ]
    list_filter = ["tenant_id"]
    search_fields = ["name"]
    ordering = ["name"]
    fields = readonly_fields = (
        "name",
        "tenant_id",
        "permissions",
        "created_at",
        "last_used_at",
        "expires_at",
    )

    @admin.display(description="permissions")
    def permission_list(self, token: ApiToken) -> str:
        return ", ".join(token.permissions)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # only the command creates tokens: it is the one place the secret is shown

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
