"""kumiflow-django's HTTP surface: a JSON API, live run streams (SSE), async entry points.

Mount it with ``path("api/kumiflow/", include("kumiflow_django.http.urls"))``.
Importing this package has no side effects: the token model, its admin and
the notification receiver are registered by :mod:`kumiflow_django.http.ready`,
which the app config imports once the app registry is ready.
"""
