from django.apps import AppConfig


class FaultsConfig(AppConfig):
    name = "bench.faults"
    label = "bench_faults"
    verbose_name = "Fault suite workflows"

    def ready(self) -> None:
        from bench.faults import workflows  # noqa: F401 - registers the workflows
