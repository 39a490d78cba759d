from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class KumiflowConfig(AppConfig):
    name = "kumiflow_django"
    label = "kumiflow"
    verbose_name = _("Workflows")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from kumiflow_django import checks  # noqa: F401  (registers the checks)
