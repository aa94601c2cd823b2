"""Find a tokenizer directory's chat template on disk (the I/O half of `app.tokens.render_export`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.errors import InputError
from app.tokens.render_export import ChatTemplate


def load_chat_template(
    tokenizer_dir: Path, override: Path | None = None, kwargs: dict[str, Any] | None = None
) -> ChatTemplate | None:
    """The chat template for a tokenizer directory: `override` file, `chat_template.jinja`, or the config's
    `chat_template` entry; None when the directory has none."""
    specials: dict[str, str] = {}
    config: dict[str, Any] = {}
    config_path = tokenizer_dir / "tokenizer_config.json"
    if config_path.exists():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError(f"{config_path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = config.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                specials[key] = value
    kwargs = dict(kwargs or {})
    if override is not None:
        try:
            return ChatTemplate(str(override), override.read_text(encoding="utf-8"), specials, kwargs)
        except OSError as exc:
            raise InputError(f"{override}: cannot read the chat template ({exc.strerror or exc})") from None
    jinja = tokenizer_dir / "chat_template.jinja"
    if jinja.exists():
        return ChatTemplate(str(jinja), jinja.read_text(encoding="utf-8"), specials, kwargs)
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if isinstance(template, str) and template:
        return ChatTemplate(f"{config_path}:chat_template", template, specials, kwargs)
    return None


def template_kwargs_of_run(config: dict[str, Any]) -> dict[str, Any]:
    """`chat_template_kwargs` the run sent (from its endpoints' `extra`), so the prompt matches the server's."""
    found: list[dict[str, Any]] = []
    for ep in config.get("endpoints") or []:
        extra = (ep.get("extra") or {}) if isinstance(ep, dict) else {}
        kwargs = extra.get("chat_template_kwargs") if isinstance(extra, dict) else None
        found.append(kwargs if isinstance(kwargs, dict) else {})
    if not found:
        return {}
    if any(f != found[0] for f in found):
        raise InputError(
            "the run's endpoints send different chat_template_kwargs, so prompts differ per endpoint; "
            "pass --template-kwargs JSON to choose one"
        )
    return found[0]
