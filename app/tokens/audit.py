"""Check a tokenizer's special tokens, and id constants someone wrote down, against a template profile."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.tokens.profile import Profile
from app.tokens.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class AuditFinding:
    """One checked token: level ok | warning | error, the token text, its id (if any) and a sentence."""

    level: str
    token: str
    token_id: int | None
    message: str


def audit_tokenizer(
    tokenizer: Tokenizer, profile: Profile, constants: Mapping[str, int] | None = None
) -> list[AuditFinding]:
    """Each profile marker must encode to exactly one id that decodes back; each constant must decode to its
    token text (an id whose decoding is ordinary text, like 163533 -> 'chas', is an error)."""
    findings: list[AuditFinding] = []
    required = set(profile.markers)
    check_known = profile.vocab_size is not None and profile.vocab_size == tokenizer.vocab_size
    for text in dict.fromkeys([*profile.markers, *profile.audit_tokens]):
        tid = tokenizer.special_id(text)
        if tid is None:
            level = "error" if text in required and _needed(profile, text) else "warning"
            findings.append(AuditFinding(level, text, None, f"{text} is not a special token of this tokenizer"))
            continue
        ids = tokenizer.encode(text)
        back = tokenizer.decode([tid])
        if ids != [tid]:
            findings.append(AuditFinding("error", text, tid, f"{text} encodes to {ids}, not to the single id {tid}"))
            continue
        if back != text:
            findings.append(AuditFinding("error", text, tid, f"id {tid} decodes to {back!r}, not {text!r}"))
            continue
        known = profile.audit_tokens.get(text)
        if check_known and known is not None and known != tid:
            findings.append(
                AuditFinding(
                    "error",
                    text,
                    tid,
                    f"{text} is id {tid} here but {known} in the {profile.name} reference table; is this the "
                    f"right tokenizer?",
                )
            )
            continue
        findings.append(AuditFinding("ok", text, tid, "encodes to one id and decodes back"))
    for text, cid in (constants or {}).items():
        findings.append(_check_constant(tokenizer, text, cid))
    return findings


def _needed(profile: Profile, text: str) -> bool:
    return text in (profile.think_close, profile.end_of_turn, profile.end_token(True), *profile.tool_markers.values())


def _check_constant(tokenizer: Tokenizer, text: str, cid: int) -> AuditFinding:
    if not isinstance(cid, int) or isinstance(cid, bool) or cid < 0:
        return AuditFinding("error", text, None, f"constant {text} = {cid!r} is not a token id")
    right = tokenizer.special_id(text)
    hint = f"; the right id is {right}" if right is not None else ""
    try:
        back = tokenizer.token_bytes(cid).decode("utf-8", errors="replace")
    except ValueError:
        return AuditFinding(
            "error", text, cid, f"constant {text} = {cid} is outside the vocabulary (size {tokenizer.vocab_size}){hint}"
        )
    if not tokenizer.is_special(cid):
        return AuditFinding(
            "error",
            text,
            cid,
            f"constant {text} = {cid} decodes to {back!r}, an ordinary text token, not the special token {text}{hint}",
        )
    if back != text:
        return AuditFinding("error", text, cid, f"constant {text} = {cid} decodes to {back!r}, not {text}{hint}")
    return AuditFinding("ok", text, cid, f"constant {text} = {cid} decodes back")
