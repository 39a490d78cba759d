"""The app's configuration: what happens when Django starts."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class KumiflowConfig(AppConfig):
    name = "kumiflow_django"
    label = "kumiflow"
    verbose_name = _("Workflows")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: they import the models, which Django
        # can only load once the app registry is ready.
        from django.db.backends.signals import connection_created
        from django.utils.module_loading import autodiscover_modules

        from kumiflow_django import (  # noqa: F401  (register checks, step kinds)
            checks,
            steps,
            tasks,  # noqa: F401  (its hooks after commit)
        )
        from kumiflow_django.engine.receivers import on_event_appended
        from kumiflow_django.http import ready as http_ready  # noqa: F401  (tokens, notify)
        from kumiflow_django.signals import event_appended
        from kumiflow_django.store.immutability import register_sqlite_function

        event_appended.connect(on_event_appended, dispatch_uid="kumiflow-engine")
        connection_created.connect(register_sqlite_function, dispatch_uid="kumiflow-sqlite-permit")
        autodiscover_modules("workflows")
        self.install_integrations()

    def install_integrations(self) -> None:
        """OpenTelemetry and Prometheus, each when its library is installed and
        its setting (KUMIFLOW_TRACING, KUMIFLOW_METRICS) does not switch it off.
        Imported only then: the core never imports either library."""
        from kumiflow_django.observability import enabled

        if enabled("TRACING"):
            from kumiflow_django.observability import otel

            otel.install()
        if enabled("METRICS"):
            from kumiflow_django.observability import metrics

            metrics.install()
