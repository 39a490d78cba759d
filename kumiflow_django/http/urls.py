"""The API's URLs, mounted from the endpoint table of :mod:`kumiflow_django.http.openapi`.

    path("api/kumiflow/", include("kumiflow_django.http.urls")),

URL names live in the ``kumiflow_api`` namespace: ``kumiflow_api:runs``,
``kumiflow_api:run``, ``kumiflow_api:run-events``, ...
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.urls import URLPattern, path

from kumiflow_django.http import openapi, sse, views

app_name = "kumiflow_api"


def _route(openapi_path: str) -> str:
    """``/runs/{run_id}/`` as Django's ``runs/<str:run_id>/``."""
    return re.sub(r"\{(\w+)\}", r"<str:\1>", openapi_path.removeprefix("/"))


def _patterns() -> list[URLPattern]:
    patterns = []
    for openapi_path, methods in openapi.by_path().items():
        names = {e.name for e in methods.values()}
        assert len(names) == 1, f"{openapi_path} has several URL names: {names}"
        view: Callable[..., Any]
        if any(e.media_type == "text/event-stream" for e in methods.values()):
            assert list(methods) == ["get"], f"{openapi_path}: a stream is served alone"
            view = sse.run_events_view
        else:
            view = views.api_view(methods)
        patterns.append(path(_route(openapi_path), view, name=names.pop()))
    return patterns


urlpatterns = _patterns()
