"""Prompt ids for an export: a Jinja chat template rendered as transformers renders it, or the profile's own
renderer (`app.tokens.prompt.render_prompt`) when the tokenizer directory ships no template.

Pure: the template text arrives already read (`app.export.templates.load_chat_template` does the file I/O).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.errors import InputError


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template and the special-token strings transformers passes to it."""

    source: str  # where it came from, for messages and the manifest
    text: str
    special_tokens: dict[str, str] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs (e.g. thinking=False)

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[Any] | None,
        *,
        add_generation_prompt: bool,
        **extra: Any,
    ) -> str:
        """The conversation as text, exactly as transformers' `apply_chat_template(tokenize=False)` renders it.

        Dict messages and tools of JSON data (as read from the store) with JSON-scalar kwargs: the template,
        compiled once by transformers' own compiler (its sandbox, filters and globals), is rendered directly,
        without the per-call deep copy transformers makes to defuse rich objects, which JSON data never holds.
        Anything else goes through transformers' `render_jinja_template`. tests/export/test_fast_renderer.py
        checks both equal apply_chat_template's output byte for byte."""
        settings = {**self.special_tokens, **self.kwargs, **extra}
        fast = _fast_renderer()
        if (
            fast is None
            or not all(isinstance(m, dict) for m in messages)
            or (tools and not all(isinstance(t, dict) for t in tools))
            or not all(type(v) in _SCALARS for v in settings.values())
        ):
            # transformers' own entry point: no fast helpers, or inputs it converts or rejects (tools given as
            # functions, non-dict messages, template kwargs that are not JSON scalars)
            rendered, _ = _jinja_renderer()(
                conversations=[list(messages)],
                tools=list(tools) if tools else None,
                chat_template=self.text,
                add_generation_prompt=add_generation_prompt,
                **settings,
            )
            return rendered[0]
        compile_template, alias_reasoning = fast
        return compile_template(self.text).render(
            messages=alias_reasoning(messages),
            tools=list(tools) if tools else None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **settings,
        )


_SCALARS = (str, int, float, bool, type(None))


def _jinja_renderer() -> Callable[..., tuple[list[str], Any]]:
    """transformers' `render_jinja_template` (the code behind `apply_chat_template`), imported quietly."""
    from app.libnoise import silence_library_noise

    silence_library_noise()
    from transformers.utils.chat_template_utils import render_jinja_template

    # transformers annotates it `-> str` but returns (rendered conversations, generation indices)
    return render_jinja_template  # type: ignore[return-value]


_FAST: list[Any] = []


def _fast_renderer() -> tuple[Callable[[str], Any], Callable[[Sequence[dict[str, Any]]], list]] | None:
    """transformers' own pieces of `render_jinja_template` (transformers/utils/chat_template_utils.py):
    `_compile_jinja_template` (cached; ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, the
    generation and loopcontrols extensions, `tojson`, `raise_exception`, `strftime_now`, `dict`, `namespace`)
    and `_alias_reasoning_fields` (reasoning_content / thinking / reasoning filled from each other); None when
    this transformers lacks them."""
    if not _FAST:
        from app.libnoise import silence_library_noise

        silence_library_noise()
        try:
            from transformers.utils.chat_template_utils import _alias_reasoning_fields, _compile_jinja_template
        except ImportError:
            _FAST.append(None)
        else:
            _FAST.append((_compile_jinja_template, _alias_reasoning_fields))
    return _FAST[0]


class PromptRenderer:
    """Prompt ids for a conversation: the chat template (generation prompt included) encoded with the tokenizer,
    or the profile's own renderer from `app.tokens` when the tokenizer directory has no template."""

    def __init__(self, tokenizer, profile, template: ChatTemplate | None, kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.profile = profile
        self.template = template
        self._profile_kwargs = profile_render_kwargs(kwargs or {})
        self._profile_render: Callable[..., str] | None = None
        if template is None:
            import app.tokens as tokens

            self._profile_render = getattr(tokens, "render_prompt", None)
            if self._profile_render is None:
                raise InputError(
                    f"{tokenizer.path}: has no chat template (no chat_template.jinja and no chat_template in "
                    f"tokenizer_config.json) and profile {profile.name!r} has no prompt renderer; pass "
                    "--chat-template FILE with the model's Jinja template"
                )

    @property
    def profile_kwargs(self) -> dict[str, Any]:
        """Options passed to the profile renderer (thinking, preserve_thinking), as the run sent them."""
        return dict(self._profile_kwargs)

    @property
    def kind(self) -> str:
        """`chat_template` or `profile`: which renderer made the prompt ids (recorded in the manifest)."""
        return "chat_template" if self.template is not None else "profile"

    def prompt_text(self, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None) -> str:
        """The prompt as text, ending with the generation prompt (for K2.5: `...<|im_middle|><think>`)."""
        if self.template is not None:
            return self.template.render(messages, tools, add_generation_prompt=True)
        assert self._profile_render is not None
        return self._profile_render(
            self.profile, list(messages), list(tools) if tools else None, **self._profile_kwargs
        )

    def prompt_ids(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None, sample_id: str = "?"
    ) -> list[int]:
        """The prompt ids a server would feed the model for this conversation, encoded as the server encodes
        them (the tokenizer's normaliser applied: `Tokenizer.encode_prompt`); InputError naming the sample when
        the template rejects it."""
        try:
            text = self.prompt_text(messages, tools)
        except InputError:
            raise
        except Exception as exc:  # jinja2 errors, raise_exception() in templates, malformed messages
            where = self.template.source if self.template is not None else f"profile {self.profile.name}"
            raise InputError(
                f"sample {sample_id!r}: the chat template ({where}) could not render its prompt: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        return self.tokenizer.encode_prompt(text)


def profile_render_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The run's chat_template_kwargs in `render_prompt`'s terms (Qwen's `enable_thinking` is `thinking`)."""
    out: dict[str, Any] = {}
    for key, name in (
        ("thinking", "thinking"),
        ("enable_thinking", "thinking"),
        ("preserve_thinking", "preserve_thinking"),
    ):
        if key in kwargs:
            out[name] = bool(kwargs[key])
    return out
