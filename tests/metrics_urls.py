"""The URLs of the metrics tests: the metrics view as a project mounts it."""

from django.urls import path

from kumiflow_django.observability.metrics import metrics_view

urlpatterns = [path("metrics", metrics_view, name="kumiflow-metrics")]
