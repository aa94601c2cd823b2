"""What can go wrong with one chat-completion attempt, as a small hierarchy callers branch on.

- `RetryableError`: try the same request again later (408, 409, 429, 5xx, 524, 529, network errors,
  timeouts, a stream that failed or ended early). `retry_after_s` is the server's requested wait when it sent one.
  - `MalformedResponse`: the body broke the boundary (`app.providers.wire`): not JSON, a field of the wrong
    type or out of range, a second choice. `field` names the field.
  - `EndpointUnreachable`: no byte of a response came back: DNS, a refused or timed-out connect, TLS, a reset
    before the response head. The endpoint failed, not the sample: the engine retries it without using the
    sample's attempts and marks the endpoint down after a run of them (`app.engine.health.endpoint_health`).
- `SampleFatalError`: this request will never succeed (400, 413, 422, other 4xx, content filtered).
- `RunStoppingError`: no request will succeed until an operator acts (401, 402 out of credits, 403,
  404 model not found): the engine pauses the run.

Each error carries `error_class`, a member of app.records.ErrorClass (a short stable string for metrics: "429",
"5xx", "timeout", "network", "stream", "malformed", "unreachable", "auth", ...), or for a rejecting HTTP status
the vocabulary does not name, its number ("400", "422": app.records.http_error_class). Messages
never contain the API key: the client builds them from the status and the body, never from headers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.errors import EaglewatchError
from app.records import ErrorClass

if TYPE_CHECKING:
    from app.records import Usage


class ProviderError(EaglewatchError):
    """One attempt failed. `status` is the HTTP status when there was one."""

    error_class: str = ErrorClass.PROVIDER

    def __init__(
        self,
        message: str,
        *,
        error_class: str | None = None,
        status: int | None = None,
        cost_usd: float = 0.0,
    ) -> None:
        super().__init__(message)
        if error_class is not None:
            self.error_class = error_class
        self.status = status
        # what the provider reported billing for this failed attempt (usually 0: OpenRouter does
        # not charge errored generations); the engine records it with the failure, never twice
        self.cost_usd = cost_usd
        # the failed attempt's usage counts when they were sound (app.records.Usage): the engine charges
        # the larger of `cost_usd` and their list price
        self.usage: Usage | None = None
        # a response (of any status) came back from the endpoint: it is there (app.engine.health.endpoint_health)
        self.answered = status is not None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.error_class)!r}, {str(self)!r})"


class RetryableError(ProviderError):
    """Worth retrying; wait at least `retry_after_s` when the server asked for it."""

    error_class = ErrorClass.RETRYABLE

    def __init__(self, message: str, *, retry_after_s: float | None = None, **kwargs) -> None:
        super().__init__(message, **kwargs)
        self.retry_after_s = retry_after_s


class SampleFatalError(ProviderError):
    """This sample's request cannot succeed as sent; mark the sample failed and move on."""

    error_class = ErrorClass.FATAL


class RunStoppingError(ProviderError):
    """Every request will fail until an operator acts (key, credits, permissions): pause the run."""

    error_class = ErrorClass.STOPPING
    exit_code = 3


class MalformedResponse(RetryableError):
    """The body broke the boundary at `field` (see app.providers.wire); `cost_usd` is what its usage reported
    when that part was sound."""

    error_class = ErrorClass.MALFORMED

    def __init__(self, field: str, detail: str, **kwargs) -> None:
        super().__init__(f"the provider sent a malformed response: {field} {detail}", **kwargs)
        self.field = field


class EndpointUnreachable(RetryableError):
    """Nothing came back from the endpoint (`cause`: dns, refused, connect_timeout, tls, reset, connect): a failure of
    the endpoint, not of the sample."""

    error_class = ErrorClass.UNREACHABLE

    def __init__(self, message: str, *, cause: str = "connect", **kwargs) -> None:
        super().__init__(message, **kwargs)
        self.cause = cause
