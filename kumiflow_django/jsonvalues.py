"""What "JSON-serialisable" means everywhere in kumiflow-django."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from kumiflow_django.exceptions import InvalidEvent


def to_json(value: Any, what: str) -> Any:
    """``value`` as it reads back from a JSON column; InvalidEvent when it cannot be.

    Datetimes, dates, decimals and UUIDs become strings (DjangoJSONEncoder);
    NaN and infinities are refused (PostgreSQL's jsonb has no such numbers).
    """
    try:
        text = json.dumps(value, cls=DjangoJSONEncoder, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidEvent(f"{what} is not JSON-serialisable: {exc}") from exc
    return json.loads(text)
