"""Token ids from API text: tokenizer backends, template profiles, reconstruction, compare and align.

Pure and synchronous (no asyncio, httpx or aiosqlite); safe to call from a thread pool.
See docs/contracts.md, "Tokens" and "Alignment".
"""

from app.tokens.align import align, diff_spans, visible_text
from app.tokens.compare import compare
from app.tokens.profile import PROFILES, Profile, get_profile
from app.tokens.reconstruct import REPAIRS, Fields, Reconstructor
from app.tokens.template import ProviderView, parse_output, pieces_text, render_output, split_output
from app.tokens.tokenizer import KIMI_PATTERN, Tokenizer, load_tokenizer

_LAZY = {"render_prompt", "render_conversation"}  # app.tokens.prompt, imported on first use


def __getattr__(name: str):
    if name in _LAZY:
        from app.tokens import prompt

        return getattr(prompt, name)
    raise AttributeError(f"module 'app.tokens' has no attribute {name!r}")


__all__ = [
    "KIMI_PATTERN",
    "PROFILES",
    "REPAIRS",
    "Fields",
    "Profile",
    "ProviderView",
    "Reconstructor",
    "Tokenizer",
    "align",
    "compare",
    "diff_spans",
    "get_profile",
    "load_tokenizer",
    "parse_output",
    "pieces_text",
    "render_conversation",
    "render_output",
    "render_prompt",
    "split_output",
    "visible_text",
]
