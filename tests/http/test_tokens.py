"""API tokens: created by a command that shows them once, stored as a hash, read-only in admin."""

from __future__ import annotations

import hashlib
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from kumiflow_django.http.models import ApiToken
from kumiflow_django.http.tokens import create_token, find_token
from tests.http.conftest import API, TokenClient

pytestmark = pytest.mark.django_db


def create(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("kumiflow_token", "create", *args, stdout=out, stderr=err)
    return out.getvalue().strip(), err.getvalue()


def test_the_command_prints_the_token_once_and_stores_only_its_hash():
    secret, note = create(
        "--name",
        "ci",
        "--perm",
        "view_workflowrun",
        "--perm",
        "kumiflow.append_event",
        "--tenant",
        "acme",
    )
    assert secret.startswith("kf_") and len(secret) > 40
    assert "shown this once" in note and secret not in note
    token = ApiToken.objects.get()
    assert (token.name, token.tenant_id, token.permissions) == (
        "ci",
        "acme",
        ["kumiflow.append_event", "kumiflow.view_workflowrun"],
    )
    assert token.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    stored = [str(v) for v in ApiToken.objects.values_list().get()]
    assert not any(secret in value for value in stored), "the secret itself is nowhere"
    assert TokenClient(secret).get(f"{API}runs/").status_code == 200


def test_the_command_refuses_unknown_permissions_and_duplicate_names():
    with pytest.raises(CommandError, match="not a permission of the HTTP API"):
        create("--name", "ci", "--perm", "delete_workflowrun")
    with pytest.raises(CommandError, match="at least one --perm"):
        create("--name", "ci")
    create("--name", "ci", "--perm", "view_workflowrun")
    with pytest.raises(CommandError, match="exists already"):
        create("--name", "ci", "--perm", "view_workflowrun")
    assert ApiToken.objects.count() == 1


def test_list_shows_no_secret_and_revoke_stops_the_token_at_once():
    secret, _ = create("--name", "ci", "--perm", "view_workflowrun", "--expires-in-days", "30")
    out = StringIO()
    call_command("kumiflow_token", "list", stdout=out)
    assert out.getvalue().startswith(
        "ci\ttenant=default\tperms=kumiflow.view_workflowrun\texpires=20"
    )
    assert secret not in out.getvalue()
    call_command("kumiflow_token", "revoke", "ci", stdout=StringIO())
    assert find_token(secret) is None
    with pytest.raises(CommandError, match="no token named"):
        call_command("kumiflow_token", "revoke", "ci", stdout=StringIO())


def test_the_admin_lists_tokens_read_only_and_revokes_them(admin_client):
    token, secret = create_token("ci", permissions=["view_workflowrun"])
    changelist = reverse("admin:kumiflow_apitoken_changelist")
    page = admin_client.get(changelist).content.decode()
    assert "kumiflow.view_workflowrun" in page and secret not in page
    assert admin_client.get(reverse("admin:kumiflow_apitoken_add")).status_code == 403
    detail = admin_client.get(reverse("admin:kumiflow_apitoken_change", args=[token.pk]))
    assert detail.status_code == 200 and token.key_hash not in detail.content.decode()
    assert (
        admin_client.post(
            reverse("admin:kumiflow_apitoken_change", args=[token.pk]), {"name": "renamed"}
        ).status_code
        == 403
    )
    admin_client.post(reverse("admin:kumiflow_apitoken_delete", args=[token.pk]), {"post": "yes"})
    assert not ApiToken.objects.exists()
