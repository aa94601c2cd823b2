"""Compare the prompt ids a server says it fed the model with the ids eaglewatch renders for the same turn.

A chat template that differs from the server's (a missing default system message, another thinking flag, a
patched template) makes every exported `eagle3-shards` row's prompt half wrong while the output half is
right; the server's `prompt_token_ids` (vLLM `return_token_ids`, SGLang `return_prompt_token_ids`) catch it
before any GPU hour is spent. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.tokens.profile import Profile
from app.tokens.prompt import render_prompt
from app.tokens.tokenizer import Tokenizer

PROMPT_STATUSES = ("agree", "differ", "no_server_ids")


@dataclass(frozen=True, slots=True)
class PromptCheck:
    """How the server's prompt ids compare with the rendered ones.

    status: agree | differ | no_server_ids. first_diff: the first differing position (the shorter length
    when one is a prefix of the other); server_id / rendered_id: the ids there (None past an end).
    """

    status: str
    first_diff: int | None = None
    server_len: int | None = None
    rendered_len: int = 0
    server_id: int | None = None
    rendered_id: int | None = None
    # the server's ids are a shorter head or tail of the rendered ones: the server cut the prompt (vLLM's
    # truncate_prompt_tokens keeps the tail), not another template (app.engine.interventions)
    cut: bool = False

    @property
    def agrees(self) -> bool:
        return self.status == "agree"

    def describe(self) -> str:
        """One sentence for an operator event."""
        if self.status == "agree":
            return f"the server's {self.server_len} prompt ids agree with the rendered prompt"
        if self.status == "no_server_ids":
            return "the server returned no prompt ids; the rendered prompt is unchecked"
        return (
            f"the server's prompt ids differ from the rendered prompt at position {self.first_diff} "
            f"(server {self.server_id}, rendered {self.rendered_id}; lengths {self.server_len} and "
            f"{self.rendered_len}): the chat template differs from the server's"
        )


def compare_prompt_ids(server_ids: Sequence[int] | None, rendered_ids: Sequence[int]) -> PromptCheck:
    """The PromptCheck of the server's prompt ids (None when it returned none) against `rendered_ids`."""
    rendered_len = len(rendered_ids)
    if server_ids is None:
        return PromptCheck("no_server_ids", rendered_len=rendered_len)
    n = len(server_ids)
    for k in range(min(n, rendered_len)):
        if server_ids[k] != rendered_ids[k]:
            tail = 0 < n < rendered_len and list(server_ids) == list(rendered_ids[rendered_len - n :])
            return PromptCheck("differ", k, n, rendered_len, server_ids[k], rendered_ids[k], cut=tail)
    if n != rendered_len:
        k = min(n, rendered_len)
        return PromptCheck(
            "differ",
            k,
            n,
            rendered_len,
            server_ids[k] if k < n else None,
            rendered_ids[k] if k < rendered_len else None,
            cut=n < rendered_len,  # a head of the rendered ids
        )
    return PromptCheck("agree", None, n, rendered_len)


def rendered_prompt_ids(
    tokenizer: Tokenizer,
    profile: Profile | str,
    messages: Sequence[dict],
    tools: Sequence[dict] | None = None,
    *,
    thinking: bool = True,
) -> list[int]:
    """The ids eaglewatch renders for a request's prompt: `app.tokens.prompt.render_prompt` (with the
    generation prompt), encoded as the server encodes it (normaliser applied, special-token strings mapped to
    their ids: `Tokenizer.encode_prompt`)."""
    return tokenizer.encode_prompt(render_prompt(profile, messages, tools, thinking=thinking))


def check_prompt(
    tokenizer: Tokenizer,
    profile: Profile | str,
    messages: Sequence[dict],
    tools: Sequence[dict] | None,
    server_ids: Sequence[int] | None,
    *,
    thinking: bool = True,
) -> PromptCheck:
    """`compare_prompt_ids` of the server's ids against the rendered prompt of `messages` and `tools`."""
    if server_ids is None:
        return PromptCheck("no_server_ids")
    return compare_prompt_ids(server_ids, rendered_prompt_ids(tokenizer, profile, messages, tools, thinking=thinking))
