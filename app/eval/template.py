"""The template guard: the prompt ids a server fed the model against the run's own rendering of the same messages.

A server that renders another chat template (or none: a raw completions prompt) gives acceptance figures for
prompts the drafter was never trained on, and they can look better than the real ones (a raw prompt scored
3.868 against 2.079 through the template: tokenspeed #1305). The server's `prompt_token_ids` (vLLM
`return_token_ids`) are compared with the ids eaglewatch renders for export and generation
(`app.tokens.prompt_check.rendered_prompt_ids`: the profile's template, encoded as a server encodes a prompt);
a difference is a finding that names the first differing token. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.errors import InputError
from app.tokens.prompt_check import compare_prompt_ids, rendered_prompt_ids
from app.tokens.tokenizer import Tokenizer


def _decoded(tokenizer: Tokenizer, token_id: int | None) -> str | None:
    if token_id is None:
        return None
    try:
        return tokenizer.decode([token_id])
    except Exception:  # noqa: BLE001 (an id outside the vocabulary: the finding still names it)
        return None


def template_finding(
    tokenizer: Tokenizer,
    profile: str,
    messages: Sequence[dict],
    tools: Sequence[dict] | None,
    server_ids: Sequence[int] | None,
    *,
    thinking: bool = True,
) -> dict[str, Any] | None:
    """Where the server's prompt ids first differ from the rendered prompt (position, both ids, both decoded,
    both lengths), or None when they agree or the server returned none. A profile without a renderer gives a
    finding that says the prompt could not be checked."""
    if server_ids is None:
        return None
    try:
        rendered = rendered_prompt_ids(tokenizer, profile, messages, tools, thinking=thinking)
    except InputError as exc:
        return {"unchecked": str(exc)}
    check = compare_prompt_ids(server_ids, rendered)
    if check.agrees:
        return None
    return {
        "position": check.first_diff,
        "server_id": check.server_id,
        "rendered_id": check.rendered_id,
        "server_token": _decoded(tokenizer, check.server_id),
        "rendered_token": _decoded(tokenizer, check.rendered_id),
        "server_len": check.server_len,
        "rendered_len": check.rendered_len,
    }


def describe_finding(finding: dict[str, Any]) -> str:
    """The finding as a phrase: 'at position 0: server 785 'The', rendered 151644 '<|im_start|>''."""
    if "unchecked" in finding:
        return f"the prompt could not be rendered to check it ({finding['unchecked']})"
    return (
        f"at position {finding['position']}: server id {finding['server_id']} {finding['server_token']!r}, "
        f"rendered id {finding['rendered_id']} {finding['rendered_token']!r} (lengths {finding['server_len']} and "
        f"{finding['rendered_len']})"
    )
