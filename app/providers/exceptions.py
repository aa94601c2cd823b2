"""What can go wrong with one chat-completion attempt, as a small hierarchy callers branch on.

- `RetryableError`: try the same request again later (408, 409, 429, 5xx, 524, 529, network errors,
  timeouts, a stream that failed or ended early, a malformed body). `retry_after_s` is the server's
  requested wait when it sent one.
- `SampleFatalError`: this request will never succeed (400, 413, 422, other 4xx, content filtered).
- `RunStoppingError`: no request will succeed until an operator acts (401, 402 out of credits, 403,
  404 model not found): the engine pauses the run.

Each error carries `error_class`, a short stable string for metrics ("429", "5xx", "timeout", "network",
"stream", "malformed", "auth", "credits", "forbidden", "not_found", "filtered", "400", ...). Messages
never contain the API key: the client builds them from the status and the body, never from headers.
"""

from __future__ import annotations

from app.errors import EaglewatchError


class ProviderError(EaglewatchError):
    """One attempt failed. `status` is the HTTP status when there was one."""

    error_class: str = "provider"

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

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.error_class!r}, {str(self)!r})"


class RetryableError(ProviderError):
    """Worth retrying; wait at least `retry_after_s` when the server asked for it."""

    error_class = "retryable"

    def __init__(self, message: str, *, retry_after_s: float | None = None, **kwargs) -> None:
        super().__init__(message, **kwargs)
        self.retry_after_s = retry_after_s


class SampleFatalError(ProviderError):
    """This sample's request cannot succeed as sent; mark the sample failed and move on."""

    error_class = "fatal"


class RunStoppingError(ProviderError):
    """Every request will fail until an operator acts (key, credits, permissions): pause the run."""

    error_class = "stopping"
    exit_code = 3
