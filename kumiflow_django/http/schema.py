"""The JSON schemas of the API's bodies, and the small validator that enforces them.

These dictionaries are the one description of what the API accepts and
answers: the OpenAPI document embeds them, and every request body and
query is checked against them before anything runs. The validator knows
the part of JSON Schema used here (types, required, properties,
additionalProperties, lengths, ranges, enums, patterns, items), which keeps
the core free of a jsonschema dependency.
"""

from __future__ import annotations

import re
from typing import Any

from kumiflow_django.http.errors import ApiError, bad_request
from kumiflow_django.models import RunStatus
from kumiflow_django.store import limits

# No C0/C1 control characters and no lone surrogates: the engine refuses them
# in names and keys, and saying so here names the field.
_PLAIN = "^[^\\u0000-\\u001f\\u007f-\\u009f\\ud800-\\udfff]*$"


def _text(max_length: int, description: str, *, pattern: str = _PLAIN) -> dict[str, Any]:
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": max_length,
        "pattern": pattern,
        "description": description,
    }


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "type": [schema["type"], "null"]}


TIMESTAMP = {"type": "string", "format": "date-time"}
STATUSES = [s.value for s in RunStatus]
TENANT = _text(64, "The tenant; only one the caller may see. Default: the caller's own.")

ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "field"],
            "properties": {
                "code": {
                    "type": "string",
                    "enum": [
                        "bad_request",
                        "unauthenticated",
                        "forbidden",
                        "not_found",
                        "method_not_allowed",
                        "conflict",
                    ],
                },
                "message": {"type": "string"},
                "field": {
                    "type": ["string", "null"],
                    "description": "The body field, query parameter or header that is wrong.",
                },
            },
        }
    },
}

_RUN_SUMMARY_PROPERTIES: dict[str, Any] = {
    "id": {"type": "string", "format": "uuid"},
    "tenant": {"type": "string"},
    "workflow": {"type": "string"},
    "workflow_version": {"type": ["string", "null"]},
    "status": {"type": "string", "enum": STATUSES},
    "position": {
        "type": ["string", "null"],
        "description": "The path of the step the run is suspended (or failed) at, "
        'such as "2" or "3.then.0"; null when it is at none.',
    },
    "idempotency_key": {"type": ["string", "null"]},
    "stream_version": {
        "type": "integer",
        "description": "The version of the run's last event (the id of the last "
        "message of its live stream).",
    },
    "started_at": TIMESTAMP,
    "updated_at": TIMESTAMP,
    "finished_at": {"type": ["string", "null"], "format": "date-time"},
    "attributes": {
        "type": "object",
        "description": "The run's search attributes: name -> string, integer or boolean.",
    },
}

RUN_SUMMARY: dict[str, Any] = {
    "type": "object",
    "required": list(_RUN_SUMMARY_PROPERTIES),
    "properties": _RUN_SUMMARY_PROPERTIES,
}

_RUN_PROPERTIES: dict[str, Any] = {
    **_RUN_SUMMARY_PROPERTIES,
    "cursor": {
        "type": ["array", "null"],
        "description": "The position as the engine keeps it: step indexes and branch names.",
    },
    "attempt": {"type": "integer", "minimum": 1},
    "wake_at": {
        "type": ["string", "null"],
        "format": "date-time",
        "description": "When a waiting run continues (a timer, a timeout, a retry).",
    },
    "awaiting": {
        "type": ["object", "null"],
        "description": "The event type a run in waiting_event waits for.",
        "required": ["event_type"],
        "properties": {"event_type": {"type": "string"}},
    },
    "waiting_for": {
        "type": ["object", "null"],
        "description": "What a run in waiting_event waits for, in the console's words: its "
        "task (a task step awaits kumiflow.task.settled), a delivery (a webhook step that "
        "wants the answer) or an event; null when it waits for none.",
        "required": ["kind", "step", "path", "event_type", "id", "text"],
        "properties": {
            "kind": {"type": "string", "enum": ["task", "delivery", "event"]},
            "event_type": {"type": "string", "description": "The awaited event type, as stored."},
            "step": {"type": ["string", "null"], "description": "The waiting step's name."},
            "path": {"type": "string", "description": "The waiting step's path."},
            "id": {
                "type": ["string", "null"],
                "description": "The task's or the dispatch's id; null for an event.",
            },
            "text": {"type": "string", "description": "As the console says it."},
        },
    },
    "input": {"description": "The payload the run was started with (manual starts)."},
    "result": {"description": "What the run returned, once completed."},
    "steps": {
        "type": "object",
        "required": ["results", "trail"],
        "properties": {
            "results": {
                "type": "object",
                "description": "The results of the named steps so far, by name.",
            },
            "trail": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The paths of the steps run so far, in order.",
            },
        },
    },
    "error": {
        "type": ["object", "null"],
        "description": "Why the run failed or was cancelled, or the last error of a "
        "scheduled retry; null otherwise.",
        "required": ["reason", "message"],
        "properties": {
            "reason": {
                "type": ["string", "null"],
                "description": "Machine-readable: step_failed, workflow_definition_changed, "
                "cancelled, ...",
            },
            "message": {"type": "string"},
        },
    },
}

RUN: dict[str, Any] = {
    "type": "object",
    "required": list(_RUN_PROPERTIES),
    "properties": _RUN_PROPERTIES,
}

RUN_PAGE: dict[str, Any] = {
    "type": "object",
    "required": ["runs", "next_cursor"],
    "properties": {
        "runs": {"type": "array", "items": {"$ref": "#/components/schemas/RunSummary"}},
        "next_cursor": {
            "type": ["string", "null"],
            "description": "Pass it as `cursor` for the next (older) page; null on the last.",
        },
    },
}

_EVENT_PROPERTIES: dict[str, Any] = {
    "position": {"type": "integer", "description": "The event's place in the whole log."},
    "event_id": {"type": "string", "format": "uuid"},
    "tenant": {"type": "string"},
    "stream_type": {"type": "string"},
    "stream_id": {"type": "string"},
    "version": {"type": "integer", "minimum": 1},
    "type": {"type": "string"},
    "schema_version": {"type": "integer"},
    "payload": {"type": "object"},
    "metadata": {"type": "object"},
    "created_at": TIMESTAMP,
    "created_by": {"type": "string"},
}

EVENT: dict[str, Any] = {
    "type": "object",
    "required": list(_EVENT_PROPERTIES),
    "properties": _EVENT_PROPERTIES,
}

PRIORITY: dict[str, Any] = {
    "type": ["integer", "null"],
    "minimum": limits.MIN_PRIORITY,
    "maximum": limits.MAX_PRIORITY,
    "description": "The priority of the run (of the runs the event starts), from -100 to "
    "100, higher first; default: the workflow's (docs/flow-control.md).",
}

START_RUN: dict[str, Any] = {
    "type": "object",
    "required": ["workflow"],
    "additionalProperties": False,
    "properties": {
        "workflow": _text(200, "The name of a registered workflow."),
        "payload": {
            "type": "object",
            "description": "What the run's steps read as ctx.event.payload.",
        },
        "idempotency_key": _nullable(
            _text(200, "A second start with the same key returns the first run.")
        ),
        "version": _nullable(
            _text(50, "A registered version of the workflow; default: the current one.")
        ),
        "priority": PRIORITY,
        "tenant": TENANT,
    },
}

APPEND_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["stream_id", "type"],
    "additionalProperties": False,
    "properties": {
        "stream_id": _text(100, "The stream (an order, a user, ...) the event belongs to."),
        "type": _text(
            200,
            "The event's type. Types under kumiflow. are the engine's own.",
            pattern="^(?!kumiflow\\.)[^\\u0000-\\u001f\\u007f-\\u009f\\ud800-\\udfff]*$",
        ),
        "payload": {"type": "object"},
        "metadata": {"type": "object"},
        "stream_type": {"type": "string", "maxLength": 100, "pattern": _PLAIN},
        "expected_version": {
            "type": ["integer", "null"],
            "minimum": 0,
            "description": "The version the stream must be at (0: it must not exist); "
            "otherwise 409.",
        },
        "schema_version": {"type": "integer", "minimum": 1, "maximum": 32767},
        "priority": PRIORITY,
        "tenant": TENANT,
    },
}

# What an operator's reason may hold (store.audit.check_operator): no control
# character but a tab and line breaks, once white space (str.isspace) is
# trimmed from both ends. Written out for ECMA-262 too: no \s, which differs.
_CONTROL_BUT_LINES = "\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f-\\u009f\\ud800-\\udfff"
_SPACE = (
    "\\u0009-\\u000d\\u001c-\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a"
    "\\u2028\\u2029\\u202f\\u205f\\u3000"
)
# Leading space, then (if anything else) text from and to a character that is
# neither space nor control, then trailing space. Each part can only start where
# the one before must end, so a backtracking engine takes linear time.
_LINES = (
    f"^[{_SPACE}]*"
    f"(?:[^{_CONTROL_BUT_LINES}{_SPACE}]"
    f"(?:[^{_CONTROL_BUT_LINES}]*[^{_CONTROL_BUT_LINES}{_SPACE}])?"
    f"[{_SPACE}]*)?$"
)

_REASON = {
    "type": "string",
    "maxLength": 500,
    "pattern": _LINES,
    "description": "Why; recorded with the caller's name on the run's event. Tabs and "
    "line breaks are kept, no other control character (white space at both ends "
    "is trimmed).",
}

CANCEL_RUN: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"reason": _REASON},
}
WAKE_RUN = CANCEL_RUN
RETRY_RUN: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "reason": _REASON,
        "adopt_current_definition": {
            "type": "boolean",
            "description": "Move the run onto the workflow's current definition first.",
        },
    },
}

RESTART_RUN: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["from_step"],
    "properties": {
        "from_step": {
            "type": "string",
            "maxLength": 200,
            "description": "The step's path, as the run's trail names it (`2`, `2.then.0`); "
            "`0` starts the run again with the same input.",
        },
        "definition": {
            "type": "string",
            "enum": ["run", "current"],
            "description": "Run on the run's own definition (default) or the current one.",
        },
        "reason": _REASON,
    },
}

_PLAN_STEP = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "kind": {"type": "string"},
        "name": {"type": ["string", "null"]},
        "label": {"type": "string"},
    },
}

RESTART_PLAN: dict[str, Any] = {
    "type": "object",
    "description": "What a restart would do (kumiflow_django.restart_plan).",
    "properties": {
        "run": {"type": "string", "format": "uuid"},
        "workflow": {"type": "string"},
        "from_step": {"type": "string"},
        "definition": {"type": "string", "enum": ["run", "current"]},
        "choices": {"type": "array", "items": _PLAN_STEP, "description": "Restart points."},
        "again": {"type": "array", "items": _PLAN_STEP, "description": "Steps that may run."},
        "repeats": {
            "type": "array",
            "description": "Each side effect that happens again.",
            "items": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "what": {"type": "string"},
                    "name": {"type": ["string", "null"]},
                    "key": {
                        "type": "string",
                        "enum": ["new", "old", "none"],
                        "description": "A new idempotency key, the old one, or none (in "
                        "the run's transaction).",
                    },
                    "note": {"type": "string"},
                },
            },
        },
        "carried": {"type": "array", "items": {"type": "string"}},
        "notes": {"type": "array", "items": {"type": "string"}},
        "definition_changed": {"type": "boolean"},
        "idempotency_key": {"type": ["string", "null"]},
        "refusal": {"type": ["string", "null"]},
    },
}

DECIDE_APPROVAL: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["choice"],
    "properties": {
        "choice": {
            "type": "string",
            "minLength": 1,
            "maxLength": 64,
            "description": "One of the choices the approval declares.",
        },
        "fields": {
            "type": "object",
            "description": "Declared fields (all optional): name -> string, integer or boolean "
            "as declared.",
        },
        "approval": {
            "type": "string",
            "minLength": 1,
            "maxLength": 64,
            "description": "The approval the caller saw: refused (409) if the run waits at "
            "another one.",
        },
        "reason": _REASON,
    },
}

APPROVAL: dict[str, Any] = {
    "type": "object",
    "required": ["run", "approval", "choices", "fields", "waiting_since"],
    "properties": {
        "run": {"$ref": "#/components/schemas/RunSummary"},
        "approval": {"type": ["string", "null"], "description": "The approval's name."},
        "choices": {"type": "array", "items": {"type": "string"}},
        "fields": {
            "type": "object",
            "description": 'Declared fields: name -> "str", "int" or "bool".',
        },
        "waiting_since": TIMESTAMP,
    },
}

APPROVAL_PAGE: dict[str, Any] = {
    "type": "object",
    "required": ["approvals"],
    "properties": {
        "approvals": {"type": "array", "items": {"$ref": "#/components/schemas/Approval"}},
    },
}

PAUSE_RUN = CANCEL_RUN

#: A bulk operation's request (``kumiflow_django.bulk_runs``): the list
#: endpoint's filters, an action, a reason; ``dry_run`` answers the count only.
BULK_RUNS: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["action"],
    "properties": {
        "action": {
            "type": "string",
            "enum": ["cancel", "retry", "resume", "pause", "fail", "restart"],
            "description": "What is done to each matching run (through the same function "
            "as one run's operation).",
        },
        "from_step": {
            "type": "string",
            "maxLength": 200,
            "description": "Restart only (and required for it): the step path each run "
            "restarts from (`2`, `2.then.0`; `0` starts each again). A run where that step "
            "did not run, or that restart refuses, is skipped with the reason.",
        },
        "definition": {
            "type": "string",
            "enum": ["run", "current"],
            "description": "Restart only: each run's own definition (default) or the current one.",
        },
        "filters": {
            "type": "object",
            "additionalProperties": False,
            "description": "The list endpoint's filters: which runs (of the caller's tenants).",
            "properties": {
                "workflow": {"type": "string", "maxLength": 200},
                "status": {"type": "string", "enum": STATUSES},
                "tenant": TENANT,
                "paused": {"type": "boolean"},
            },
        },
        "reason": _REASON,
        "dry_run": {
            "type": "boolean",
            "description": "Only count the matching runs (the pre-flight count).",
        },
        "batch_size": {"type": "integer", "minimum": 1, "maximum": 10000},
    },
}

BULK_OPERATION: dict[str, Any] = {
    "type": "object",
    "required": ["action", "matching"],
    "properties": {
        "id": {"type": ["string", "null"], "format": "uuid", "description": "Null: a dry run."},
        "action": {"type": "string"},
        "status": {"type": "string", "enum": ["dry_run", "running", "done"]},
        "filters": {"type": "object"},
        "matching": {"type": "integer", "description": "Runs matching when it was recorded."},
        "from_step": {"type": "string", "description": "A restart's step path (else empty)."},
        "done": {"type": "integer"},
        "skipped": {"type": "integer"},
        "errors": {"type": "integer"},
        "skipped_reasons": {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "description": "Why runs were skipped (the action's refusal), and how many.",
        },
        "by": {"type": "string"},
        "reason": {"type": "string"},
        "created_at": {"type": ["string", "null"], "format": "date-time"},
        "finished_at": {"type": ["string", "null"], "format": "date-time"},
    },
}

#: What an operation answers: the run, or only its summary to a caller that
#: may operate runs but not view them (an operator bot's token).
OPERATED_RUN: dict[str, Any] = {
    "anyOf": [{"$ref": "#/components/schemas/Run"}, {"$ref": "#/components/schemas/RunSummary"}],
    "description": "The run after the operation: the whole run if the caller may view "
    "runs (kumiflow.view_workflowrun), else its summary.",
}

#: name -> schema, as they appear under components/schemas.
COMPONENTS: dict[str, dict[str, Any]] = {
    "Error": ERROR,
    "RunSummary": RUN_SUMMARY,
    "Run": RUN,
    "OperatedRun": OPERATED_RUN,
    "RunPage": RUN_PAGE,
    "Event": EVENT,
    "StartRun": START_RUN,
    "AppendEvent": APPEND_EVENT,
    "CancelRun": CANCEL_RUN,
    "RetryRun": RETRY_RUN,
    "WakeRun": WAKE_RUN,
    "RestartRun": RESTART_RUN,
    "RestartPlan": RESTART_PLAN,
    "DecideApproval": DECIDE_APPROVAL,
    "Approval": APPROVAL,
    "ApprovalPage": APPROVAL_PAGE,
    "PauseRun": PAUSE_RUN,
    "BulkRuns": BULK_RUNS,
    "BulkOperation": BULK_OPERATION,
}

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate(value: Any, schema: dict[str, Any], field: str) -> None:
    """Raise a 400 :class:`ApiError` naming ``field`` (or a field inside it) if
    ``value`` does not match ``schema``."""
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(_TYPES[name](value) for name in names):
            raise bad_request(field, f"must be {' or '.join(names)}, not {_json_type(value)}")
    if value is None:
        return
    if "enum" in schema and value not in schema["enum"]:
        raise bad_request(field, f"must be one of {', '.join(map(str, schema['enum']))}")
    if isinstance(value, str):
        _validate_string(value, schema, field)
    elif isinstance(value, int) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise bad_request(field, f"must be at least {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise bad_request(field, f"must be at most {schema['maximum']}")
    elif isinstance(value, dict):
        _validate_object(value, schema, field)


def _validate_string(value: str, schema: dict[str, Any], field: str) -> None:
    if len(value) < schema.get("minLength", 0):
        raise bad_request(field, "must not be empty")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        raise bad_request(field, f"must be at most {schema['maxLength']} characters long")
    pattern = schema.get("pattern")
    if pattern is not None and not _compiled(pattern).search(value):
        raise bad_request(field, _REFUSALS.get(pattern, f"must match {pattern}"))


def _validate_object(value: dict[str, Any], schema: dict[str, Any], field: str) -> None:
    properties: dict[str, Any] = schema.get("properties", {})
    prefix = f"{field}." if field else ""
    for name in schema.get("required", ()):
        if name not in value:
            raise bad_request(prefix + name, "is required")
    if schema.get("additionalProperties") is False:
        for name in value:
            if name not in properties:
                raise bad_request(prefix + str(name), "is not a known field")
    for name, sub in properties.items():
        if name in value:
            validate(value[name], sub, prefix + name)


#: What a refusal by one of these patterns says, instead of the pattern.
_REFUSALS = {
    _PLAIN: "must not contain control characters",
    _LINES: "must not contain control characters other than tabs and line breaks",
}
_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compiled(pattern: str) -> re.Pattern[str]:
    # JSON Schema writes \uXXXX escapes; Python's re reads them alike. Its
    # patterns are ECMA-262's, where "$" ends the text: Python's "$" also
    # matches before a final newline ("x\n"), so it is read as "\Z".
    if pattern not in _PATTERNS:
        python = pattern[:-1] + "\\Z" if pattern.endswith("$") else pattern
        _PATTERNS[pattern] = re.compile(python)
    return _PATTERNS[pattern]


def _json_type(value: Any) -> str:
    for name, check in _TYPES.items():
        if check(value):
            return name
    return "a number" if isinstance(value, float) else type(value).__name__


__all__ = ["COMPONENTS", "ApiError", "validate"]
