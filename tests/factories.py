"""factory-boy factories. Events go through the store: the log has no other write path."""

from __future__ import annotations

import uuid
from typing import Any

import factory

from kumiflow_django import append_event
from kumiflow_django.models import Event
from testproject.shop.models import Customer


class EventFactory(factory.Factory[Event]):
    class Meta:
        model = Event

    stream_id = factory.LazyFunction(lambda: f"stream-{uuid.uuid4().hex[:12]}")
    type = "thing.happened"
    payload = factory.Dict({"n": factory.Sequence(int)})
    tenant = None
    stream_type = "thing"

    @classmethod
    def _create(cls, model_class: Any, *args: Any, **kwargs: Any) -> Event:
        return append_event(
            kwargs.pop("stream_id"),
            kwargs.pop("type"),
            kwargs.pop("payload"),
            **kwargs,
        )


class CustomerFactory(factory.django.DjangoModelFactory[Customer]):
    class Meta:
        model = Customer
        skip_postgeneration_save = True

    user_id = factory.Sequence(lambda n: f"user-{n}")
    email = factory.LazyAttribute(lambda o: f"{o.user_id}@example.com")
