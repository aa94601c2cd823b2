"""The error-class vocabulary (app.records.ErrorClass): every member is produced somewhere, producers use only
members (or a rejecting status's number), and the overload rule names only members."""

from __future__ import annotations

from pathlib import Path

import httpx

from app.engine.settle import OVERLOAD_CLASSES
from app.providers.client import _transport_error_class
from app.providers.exceptions import (
    EndpointUnreachable,
    MalformedResponse,
    ProviderError,
    RetryableError,
    RunStoppingError,
    SampleFatalError,
)
from app.providers.parse import classify_status
from app.records import ErrorClass, http_error_class

APP = Path(__file__).resolve().parents[2] / "app"
MODERATED = {"error": {"message": "flagged", "metadata": {"flagged_input": "x"}}}


def _exception_defaults() -> set[str]:
    return {
        ProviderError("x").error_class,
        RetryableError("x").error_class,
        SampleFatalError("x").error_class,
        RunStoppingError("x").error_class,
        MalformedResponse("f", "bad").error_class,
        EndpointUnreachable("x").error_class,
    }


def _status_classes() -> set[str]:
    seen = {classify_status(status, {}, {}).error_class for status in range(200, 600)}
    seen.add(classify_status(403, {}, MODERATED).error_class)
    seen.add(classify_status(503, {}, {"error": {"message": "busy", "availability": {"retryable": True}}}).error_class)
    return seen


def _transport_classes() -> set[str]:
    return {
        _transport_error_class(TimeoutError()),
        _transport_error_class(httpx.ReadTimeout("slow")),
        _transport_error_class(ConnectionResetError()),
    }


def _engine_members() -> set[str]:
    """The members the engine names where it ends an attempt itself (wherever its modules live)."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in (APP / "engine").rglob("*.py"))
    return {m for m in ErrorClass if f"ErrorClass.{m.name}" in text} - set(OVERLOAD_CLASSES)


def test_every_member_is_produced_somewhere() -> None:
    produced = _exception_defaults() | _status_classes() | _transport_classes() | _engine_members()
    assert set(ErrorClass) - produced == set(), "members nothing produces cannot be listed"


def test_producers_use_only_members_or_a_status_number() -> None:
    for value in _exception_defaults() | _status_classes() | _transport_classes():
        assert isinstance(value, ErrorClass) or value.isdigit(), value


def test_a_status_the_vocabulary_names_is_its_member_and_any_other_its_number() -> None:
    assert http_error_class(429) is ErrorClass.RATE_LIMITED
    assert http_error_class(408) is ErrorClass.REQUEST_TIMEOUT
    assert http_error_class(422) == "422" and type(http_error_class(422)) is str
    assert classify_status(422, {}, {}).error_class == "422"


def test_members_keep_the_strings_databases_hold() -> None:
    assert {m.value for m in ErrorClass} >= {
        "429",
        "5xx",
        "timeout",
        "network",
        "stream",
        "malformed",
        "unreachable",
        "auth",
        "credits",
        "forbidden",
        "not_found",
        "filtered",
        "408",
        "409",
    }
    assert ErrorClass.RATE_LIMITED == "429" and f"{ErrorClass.SERVER}" == "5xx"


def test_the_overload_rule_names_only_members() -> None:
    assert OVERLOAD_CLASSES and all(isinstance(c, ErrorClass) for c in OVERLOAD_CLASSES)
    assert classify_status(429, {}, {}).error_class in OVERLOAD_CLASSES
