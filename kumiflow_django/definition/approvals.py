"""Approvals as declared: a wait for a person's decision, with its choices and fields.

``steps.approval("refund", choices=["approve", "decline"], fields={"note":
str})`` is a ``wait_for_event`` for the engine's ``approval-decided`` event
on the run's own stream, whose payload names the approval. What it declares
(``approval`` in the step's arguments) is checked here when the workflow is
defined, and a decision is checked against it here
(:func:`clean_decision`) before ``decide_approval`` appends it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from kumiflow_django.store import limits

#: The types a declared field may have, by the name stored in the definition.
FIELD_TYPES: dict[str, type] = {"str": str, "int": int, "bool": bool}
MAX_NAME = 64
MAX_CHOICES = 10
MAX_FIELDS = 20
#: The longest text a ``str`` field takes (as long as an operator's reason).
MAX_TEXT = limits.OPERATOR_REASON

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_PERMISSION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")


def check_word(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value) or len(value) > MAX_NAME:
        raise ValueError(
            f"{what} must be identifier-like (letters, digits, _ and -), 1 to {MAX_NAME} "
            f"characters, not {value!r:.80}"
        )
    return value


def spec(
    name: str,
    choices: Sequence[str],
    fields: Mapping[str, Any] | None,
    permission: str | None,
) -> dict[str, Any]:
    """The declaration as the step's arguments keep it (types by name: plain
    data for the fingerprint)."""
    if isinstance(choices, str) or not isinstance(choices, Sequence):
        raise ValueError(f"approval {name!r}: choices must be a list of strings")
    types: dict[str, Any] = {}
    if fields is not None and not isinstance(fields, Mapping):
        raise ValueError(f"approval {name!r}: fields must be a mapping of names to str, int, bool")
    for field, kind in (fields or {}).items():
        types[field] = next((k for k, t in FIELD_TYPES.items() if kind is t), kind)
    return {"name": name, "choices": list(choices), "fields": types, "permission": permission}


def check_spec(declared: Any) -> None:
    """ValueError naming what is wrong in an approval's declaration."""
    name = check_word(declared.get("name"), "an approval's name")
    choices = declared["choices"]
    if not choices or len(choices) > MAX_CHOICES:
        raise ValueError(f"approval {name!r} needs 1 to {MAX_CHOICES} choices")
    for choice in choices:
        check_word(choice, f"approval {name!r}: a choice")
    if len(set(choices)) != len(choices):
        raise ValueError(f"approval {name!r}: choices must differ ({choices})")
    fields = declared["fields"]
    if len(fields) > MAX_FIELDS:
        raise ValueError(f"approval {name!r}: at most {MAX_FIELDS} fields")
    for field, kind in fields.items():
        check_word(field, f"approval {name!r}: a field name")
        if kind not in FIELD_TYPES:
            raise ValueError(
                f"approval {name!r}: field {field!r} must be str, int or bool, not {kind!r:.60}"
            )
    permission = declared.get("permission")
    if permission is not None and (
        not isinstance(permission, str) or not _PERMISSION.match(permission)
    ):
        raise ValueError(
            f"approval {name!r}: permission must be 'app_label.codename', not {permission!r:.80}"
        )


def clean_decision(
    declared: Mapping[str, Any], choice: Any, fields: Mapping[str, Any] | None
) -> tuple[str, dict[str, Any]]:
    """(choice, fields) checked against the declaration; ValueError otherwise.

    Every field is optional; one that is not declared, or of another type, is
    refused (``True`` is not an ``int``)."""
    name = declared["name"]
    if choice not in declared["choices"]:
        raise ValueError(
            f"approval {name!r}: {choice!r:.60} is not one of its choices "
            f"({', '.join(declared['choices'])})"
        )
    if fields is not None and not isinstance(fields, Mapping):
        raise ValueError(f"approval {name!r}: fields must be a mapping")
    cleaned: dict[str, Any] = {}
    for field, value in (fields or {}).items():
        kind = declared["fields"].get(field)
        if kind is None:
            known = ", ".join(declared["fields"]) or "none"
            raise ValueError(f"approval {name!r} declares no field {field!r:.60} (fields: {known})")
        if value is None:
            continue
        expected = FIELD_TYPES[kind]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ValueError(
                f"approval {name!r}: field {field!r} must be {kind}, not {type(value).__name__}"
            )
        if isinstance(value, str) and len(value) > MAX_TEXT:
            raise ValueError(
                f"approval {name!r}: field {field!r} has at most {MAX_TEXT} characters"
            )
        if isinstance(value, str) and "\x00" in value:
            raise ValueError(f"approval {name!r}: field {field!r} must not contain NUL")
        cleaned[field] = value
    return str(choice), cleaned
