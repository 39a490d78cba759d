"""How a delivery tells the dispatch loop whether to try again."""

from __future__ import annotations

from typing import Any


class DeliveryFailure(Exception):
    """A failed attempt that may succeed later (5xx, 429, network trouble)."""

    retryable = True

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        retry_after: float | None = None,
        response: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after = retry_after
        #: What the server answered, when the step awaits it (a webhook's response).
        self.response = response


class PermanentFailure(DeliveryFailure):
    """A failed attempt that will fail again the same way (4xx, a bad URL)."""

    retryable = False
