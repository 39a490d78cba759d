"""API tokens of the HTTP API: a hash of each token, never the token.

Also adds the API's two new permissions (start runs, append events).
"""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiflow", "0003_run_since_gaps"),
    ]

    operations = [
        migrations.CreateModel(
            name="ApiToken",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=100, verbose_name="name")),
                (
                    "key_hash",
                    models.CharField(
                        editable=False, max_length=64, verbose_name="SHA-256 of the token"
                    ),
                ),
                ("permissions", models.JSONField(default=list, verbose_name="permissions")),
                ("tenant_id", models.CharField(max_length=64, verbose_name="tenant")),
                (
                    "created_at",
                    models.DateTimeField(
                        default=django.utils.timezone.now, verbose_name="created at"
                    ),
                ),
                (
                    "last_used_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="last used at"),
                ),
                (
                    "expires_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="expires at"),
                ),
            ],
            options={
                "verbose_name": "API token",
                "verbose_name_plural": "API tokens",
                "permissions": [
                    ("start_workflowrun", "Can start workflow runs"),
                    ("append_event", "Can append events"),
                ],
                "constraints": [
                    models.UniqueConstraint(fields=("name",), name="kumiflow_apitoken_name_uq"),
                    models.UniqueConstraint(fields=("key_hash",), name="kumiflow_apitoken_hash_uq"),
                ],
            },
        ),
    ]
