"""OpenAI-compatible chat client: request building, SSE, error classes, retries, usage -> cost."""

from app.providers.client import ChatClient
from app.providers.exceptions import ProviderError, RetryableError, RunStoppingError, SampleFatalError
from app.providers.pricing import ModelPricing, cost_of
from app.providers.retry import RetryPolicy, with_retries

__all__ = [
    "ChatClient",
    "ModelPricing",
    "ProviderError",
    "RetryPolicy",
    "RetryableError",
    "RunStoppingError",
    "SampleFatalError",
    "cost_of",
    "with_retries",
]
