from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"
    label = "bench"
    verbose_name = "Benchmark workflows"

    def ready(self) -> None:
        from bench import instrument

        instrument.install()  # only what the bench's environment asks for
