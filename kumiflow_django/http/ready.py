"""What the HTTP surface adds to the app once Django's app registry is ready.

Imported by the app config's ``ready()``: it registers the token admin where
the admin is installed, and the receiver that announces changed runs to the
live streams. (The token model is imported where Django looks for models,
``kumiflow_django.models``.)
"""

from __future__ import annotations

from django.apps import apps

from kumiflow_django import event_appended
from kumiflow_django.http.notify import on_event_appended

event_appended.connect(on_event_appended, dispatch_uid="kumiflow-http-notify")

if apps.is_installed("django.contrib.admin"):
    from kumiflow_django.http import admin as _admin  # noqa: F401  (registers the token admin)
