"""Fixtures of the HTTP API's tests: tokens, clients, a workflow the tests drive."""

from __future__ import annotations

import pytest
from django.test import Client

from kumiflow_django import define_workflow
from kumiflow_django import steps as s
from kumiflow_django.http.tokens import API_PERMISSIONS, create_token

API = "/api/kumiflow/"


def order(ctx):
    return ctx.event.payload["order"]


@pytest.fixture
def approval(registry):
    """A workflow that waits for an approval, then for a shipment, of its order."""
    return define_workflow(
        "approval",
        steps=[
            s.compute("order", order),
            s.wait_for_event("order.approved", match={"payload.order": order}, name="approved"),
            s.wait_for_event("order.shipped", match={"payload.order": order}, name="shipped"),
            s.return_(
                lambda ctx: {"order": order(ctx), "by": ctx.steps["approved"]["payload"]["by"]}
            ),
        ],
    )


class TokenClient(Client):
    """A test client that sends a bearer token with every request, and JSON bodies."""

    def __init__(self, secret: str) -> None:
        super().__init__(HTTP_AUTHORIZATION=f"Bearer {secret}")

    def post_json(self, path, data=None, **extra):
        return self.post(
            path, data if data is not None else {}, content_type="application/json", **extra
        )


@pytest.fixture
def token_client(db):
    """``token_client(*perms, tenant=...)``: a client with a new token (default: all perms)."""
    made: list[str] = []

    def make(*perms: str, tenant: str | None = None) -> TokenClient:
        _, secret = create_token(
            f"test-{len(made)}", permissions=perms or API_PERMISSIONS, tenant=tenant
        )
        made.append(secret)
        return TokenClient(secret)

    return make


@pytest.fixture
def api(token_client):
    """A client with every permission in the default tenant."""
    return token_client()
