"""The boundary of a provider body: what each field the engine reads may hold, checked as it is read.

A body is untrusted input. Every field the engine uses passes one of the readers here, which check type and
range and raise `MalformedResponse` naming the field (retryable: the same request may come back sound):

- counts (`count`): integers in [0, MAX_COUNT]; an integral float (`12.0`) is that integer; NaN, ±inf, a
  fraction, a negative number or one past the bound are refused. The bound keeps every count far inside
  SQLite's 64-bit integers, the ledger's arithmetic and a pickle to the reconstruction workers.
- ids (`ids`): a list of integers in [0, vocab_size), or [0, 2**32) while the vocabulary is not known
  (the store packs ids as uint32).
- cost (`cost`): a cost that is not finite, is negative or is above the configured cap is *not* a malformed
  body (the answer may be sound); it comes back as a problem sentence and the engine charges the list price
  instead (`app.engine.money.budget.charge`).
- strings: valid Unicode. orjson refuses a lone surrogate (`"\\ud83d"`) and invalid UTF-8; such a body is read
  again by the lenient path (`load_json`), which replaces the bad bytes and surrogates with U+FFFD and says so,
  so the completion is flagged (`Completion.wire_flags`) and nothing unencodable reaches the store.
- nesting: orjson refuses more than 1,024 levels and the stdlib fallback raises RecursionError past Python's
  limit; both are a MalformedResponse on `body`, never an internal error.

Sources of the shapes: vLLM `vllm/entrypoints/openai/engine/protocol.py` (`UsageInfo`: `prompt_tokens: int`,
`completion_tokens: int | None`, `prompt_tokens_details.cached_tokens: int | None`) and
`chat_completion/protocol.py` (`ChatCompletionResponseChoice.index: int`, `token_ids: list[int] | None`,
`ChatCompletionLogProb.logprob: float = -9999.0`, `bytes: list[int] | None`); SGLang
`python/sglang/srt/entrypoints/openai/protocol.py` (`UsageInfo.reasoning_tokens: Optional[int]`,
`ChatCompletionTokenLogprob.bytes: List[int]`); OpenRouter `usage.cost` (openrouter.ai/docs/use-cases/usage-accounting).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import orjson

from app.providers.exceptions import MalformedResponse

MAX_COUNT = 2**31 - 1  # tokens in one response; far past any context window, far inside int64
MAX_ID = 2**32  # ids are stored as packed uint32
MAX_TOOL_CALLS = 4096  # tool-call indexes per answer
DEFAULT_MAX_COST_USD = 20.0  # `[limits] max_response_cost_usd`'s default: the dearest sane single answer

TEXT_REPLACED = "wire:text_replaced"  # a lone surrogate or invalid UTF-8 in the body, replaced with U+FFFD
FINISH_MISSING = (
    "wire:finish_reason_missing"  # retired: such an answer is now a retryable "stream" fault; old rows may hold it
)

_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class WireLimits:
    """The ranges a body is checked against. `vocab_size`: the run's tokenizer's (ids at or past it are refused);
    None checks ids against uint32 only. `max_cost_usd`: a reported cost above it is absurd (charged at list price)."""

    vocab_size: int | None = None
    max_cost_usd: float = DEFAULT_MAX_COST_USD

    @property
    def id_bound(self) -> int:
        """One past the largest id a body may carry."""
        return self.vocab_size if self.vocab_size is not None else MAX_ID


DEFAULT_LIMITS = WireLimits()


# ---------------------------------------------------------------------------------------------------- JSON


def load_json(data: bytes | str, field: str) -> tuple[Any, bool]:
    """(the parsed value, whether text was replaced). orjson first (fast, strict); what it refuses is read again by
    the stdlib parser after replacing invalid UTF-8, its strings' lone surrogates replaced with U+FFFD. A value that
    is not JSON, or nests past the parsers' depth, is a MalformedResponse on `field`."""
    try:
        return orjson.loads(data), False
    except orjson.JSONDecodeError:
        pass
    replaced = False
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text, replaced = raw.decode("utf-8", "replace"), True
    else:
        text = data
    try:
        value = json.loads(text)
    except RecursionError:
        raise MalformedResponse(field, "nests deeper than a response can (over 1,000 levels)") from None
    except ValueError as exc:  # JSONDecodeError and the number parser's errors
        raise MalformedResponse(field, f"is not JSON ({exc})") from None
    if _SURROGATE.search(text) or "\\u" in text:
        value, scrubbed = _scrub(value)
        replaced = replaced or scrubbed
    return value, replaced


def _scrub(value: Any, depth: int = 0) -> tuple[Any, bool]:
    """`value` with every lone surrogate in its strings (keys included) replaced by U+FFFD, and whether any was."""
    if isinstance(value, str):
        if _SURROGATE.search(value):
            return _SURROGATE.sub("\ufffd", value), True
        return value, False
    if depth > 200:
        raise MalformedResponse("body", "nests deeper than 200 levels where text had to be repaired")
    changed = False
    if isinstance(value, list):
        out = []
        for item in value:
            item, c = _scrub(item, depth + 1)
            changed |= c
            out.append(item)
        return out, changed
    if isinstance(value, dict):
        new = {}
        for k, v in value.items():
            k2, c1 = _scrub(k, depth + 1)
            v2, c2 = _scrub(v, depth + 1)
            changed |= c1 or c2
            new[k2] = v2
        return new, changed
    return value, False


def decode_text(data: bytes) -> tuple[str, bool]:
    """UTF-8 text of `data`, with invalid bytes replaced (and True) where it is not valid UTF-8."""
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace"), True


# ---------------------------------------------------------------------------------------------------- readers


def obj(value: Any, field: str) -> dict:
    """`value` when it is a JSON object, else a MalformedResponse naming `field`."""
    if type(value) is not dict:
        raise MalformedResponse(field, f"should be an object, got {kind_of(value)}")
    return value


def opt_obj(value: Any, field: str) -> dict | None:
    """An object or null."""
    if value is None:
        return None
    return obj(value, field)


def opt_list(value: Any, field: str) -> list | None:
    """A list or null."""
    if value is None or type(value) is list:
        return value
    raise MalformedResponse(field, f"should be a list or null, got {kind_of(value)}")


def opt_str(value: Any, field: str) -> str | None:
    """A string or null."""
    if value is None or type(value) is str:
        return value
    raise MalformedResponse(field, f"should be a string or null, got {kind_of(value)}")


def count(value: Any, field: str) -> int:
    """A token count: null reads 0; else an integer in [0, MAX_COUNT] (an integral float is that integer)."""
    if value is None:
        return 0
    if type(value) is int:
        if 0 <= value <= MAX_COUNT:
            return value
        raise MalformedResponse(field, f"is {shown(value)}, outside 0..{MAX_COUNT}")
    if type(value) is float:
        if math.isfinite(value) and value.is_integer() and 0 <= value <= MAX_COUNT:
            return int(value)
        raise MalformedResponse(field, f"is {shown(value)}, not a count in 0..{MAX_COUNT}")
    raise MalformedResponse(field, f"should be a non-negative integer, got {kind_of(value)}")


def index(value: Any, field: str, bound: int = MAX_TOOL_CALLS) -> int:
    """An index: an integer in [0, bound)."""
    n = count(value, field)
    if n >= bound:
        raise MalformedResponse(field, f"is {n}, past the largest index a response may use ({bound - 1})")
    return n


def finite(value: Any, field: str, default: float = 0.0) -> float:
    """A finite number (null reads `default`); NaN and ±inf are refused."""
    if value is None:
        return default
    if type(value) is float:
        if math.isfinite(value):
            return value
        raise MalformedResponse(field, f"is {shown(value)}, not a finite number")
    if type(value) is int:
        if abs(value) <= 2**53:
            return float(value)
        raise MalformedResponse(field, f"is {shown(value)}, too large")
    raise MalformedResponse(field, f"should be a number, got {kind_of(value)}")


def ids(value: Any, field: str, limits: WireLimits) -> list[int]:
    """A list of token ids, each an integer in [0, limits.id_bound)."""
    if type(value) is not list:
        raise MalformedResponse(field, f"should be a list of token ids, got {kind_of(value)}")
    if not value:
        return value
    for v in value:
        if type(v) is not int:
            raise MalformedResponse(field, f"should hold integer token ids, got {kind_of(v)}")
    low, high = min(value), max(value)
    bound = limits.id_bound
    if low < 0 or high >= bound:
        bad = low if low < 0 else high
        where = "the tokenizer's vocabulary" if limits.vocab_size is not None else "uint32"
        raise MalformedResponse(field, f"holds id {shown(bad)}, outside {where} (0..{bound - 1})")
    return value


def byte_values(value: Any, field: str) -> tuple[int, ...]:
    """A logprob's `bytes`: integers in [0, 255]."""
    if type(value) is not list:
        raise MalformedResponse(field, f"should be a list of byte values, got {kind_of(value)}")
    for v in value:
        if type(v) is not int or not 0 <= v <= 255:
            raise MalformedResponse(field, f"holds {shown(v)}, not a byte value (0..255)")
    return tuple(value)


def cost(value: Any, field: str, limits: WireLimits) -> tuple[float | None, str | None]:
    """(the reported cost, None) when it is a finite number in [0, limits.max_cost_usd]; (None, why) when it is a
    number outside that (the engine then charges the list price and says so); null reads (None, None).
    A cost that is not a number at all is a MalformedResponse."""
    if value is None:
        return None, None
    if type(value) not in (int, float):
        raise MalformedResponse(field, f"should be a number, got {kind_of(value)}")
    if type(value) is int and abs(value) > 2**53:
        return None, f"{field} is {shown(value)}, past the cap of ${limits.max_cost_usd:g}"
    amount = float(value)
    if math.isnan(amount):
        return None, f"{field} is NaN"
    if math.isinf(amount):
        return None, f"{field} is {'+' if amount > 0 else '-'}inf"
    if amount < 0:
        return None, f"{field} is {amount:g}, negative"
    if amount > limits.max_cost_usd:
        return None, (
            f"{field} is {amount:g}, past the cap of ${limits.max_cost_usd:g} a response "
            "([limits] max_response_cost_usd)"
        )
    return amount, None


def kind_of(value: Any) -> str:
    """What a JSON value is, in words ("a string", "null", "a boolean")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number"}.get(
        type(value), type(value).__name__
    )


def shown(value: Any) -> str:
    """A number as the operator should read it (huge integers shortened)."""
    if type(value) is int and abs(value) >= 10**15:
        return f"{value:.3e}"
    return repr(value)
