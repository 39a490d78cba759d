"""Moved: ``DeliveryFailure`` and ``PermanentFailure`` are in
:mod:`kumiflow_django.store.errors` (import them from ``kumiflow_django``)."""

from __future__ import annotations

from kumiflow_django.store.deprecation import moved_names

__getattr__ = moved_names(
    __name__, dict.fromkeys(("DeliveryFailure", "PermanentFailure"), "kumiflow_django")
)
