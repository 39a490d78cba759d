"""The widths of the columns that store what users declare and send.

One source of truth: the models take their ``max_length`` from here, and
every check where a value enters (an append, a definition, a start) refuses
what would not fit, before the database sees it. Changing one of these
needs a migration.
"""

from __future__ import annotations

TENANT = 64
STREAM_ID = 100
STREAM_TYPE = 100
EVENT_TYPE = 200
CREATED_BY = 150
WORKFLOW_NAME = 200
WORKFLOW_VERSION = 50
IDEMPOTENCY_KEY = 200
#: Step paths like ``0.do.2.then.1`` (the outbox stores the requesting step's).
STEP_PATH = 200
DISPATCH_KIND = 50
CRON_EXPRESSION = 200
TIME_ZONE = 64
#: Why a schedule is disabled (an operator's reason, or the engine's).
DISABLED_REASON = 200
REASON = 64
LEASE_OWNER = 100
#: A task's function as ``module.qualname``.
TASK_FUNCTION = 300
#: A ``TASKS`` backend alias, a queue name.
TASK_BACKEND = 100
TASK_QUEUE = 100
#: Who did an operator action (a user name; also the event's ``created_by``).
OPERATOR = CREATED_BY
#: Why an operator did it (stored in the event's payload, shown in the timeline).
OPERATOR_REASON = 1000
#: The traceback a failed step leaves in its ``run-failed`` event, in characters.
TRACEBACK = 16_384
#: The step results a failed or completed run keeps in its closing event, in bytes of JSON.
CLOSING_STEPS = 16_384
#: Flow control: the key a limit, a rate, a debounce or a throttle groups by,
#: and the scope it counts in (a workflow's name, or workflow/step of a task).
FLOW_KEY = 200
FLOW_SCOPE = WORKFLOW_NAME + 1 + EVENT_TYPE
#: Priorities of runs and task attempts (Django's Tasks use the same range); higher first.
MIN_PRIORITY = -100
MAX_PRIORITY = 100
#: Search attributes (``define_workflow(attributes=...)``): a name, and a value
#: as the index stores it (text). (name, value, started_at) is one index key:
#: 4 bytes a character on MariaDB's utf8mb4 stays far below its 3072 bytes.
ATTRIBUTE_NAME = 64
ATTRIBUTE_VALUE = 200
#: Attributes one run may carry.
ATTRIBUTES_PER_RUN = 32
