"""`eaglewatch audit`: check a tokenizer's special tokens (and id constants) against a template profile.

Every marker of the profile must encode from its text to exactly one id and decode back; on the model's
real tokenizer the ids must equal the profile's reference table; each given constant must decode to its
token (an `<|im_end|>` constant of 163533 decodes to the ordinary token 'chas' and is rejected).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.errors import EaglewatchError, InputError

EXAMPLE = """\
eaglewatch audit --tokenizer ../shared/tokenizers/kimi-k2.5 --profile kimi-k2.5
eaglewatch audit --tokenizer sample_data/tokenizer --profile kimi-k2.5 --json
echo '{"<|im_end|>": 163533}' > consts.json
eaglewatch audit --tokenizer ../shared/tokenizers/kimi-k2.5 --profile kimi-k2.5 --constants consts.json   # exit 1:
'chas'"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokenizer", required=True, metavar="DIR", help="folder with tokenizer.json or tiktoken.model"
    )
    parser.add_argument("--profile", default="kimi-k2.5", metavar="P", help="template profile (default kimi-k2.5)")
    parser.add_argument(
        "--constants",
        metavar="FILE",
        help='JSON object of token text -> id used in your code, e.g. {"<|im_end|>": 163586}',
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def load_constants(path: str | Path) -> dict[str, int]:
    """Read a constants file: a JSON object token text -> id (optionally under a "constants" key)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read the constants file ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f'{path}:{exc.lineno}: not valid JSON ({exc.msg}); write an object like {{"<|im_end|>": 163586}}'
        ) from None
    if isinstance(data, dict) and isinstance(data.get("constants"), dict):
        data = data["constants"]
    if not isinstance(data, dict):
        raise InputError(f'{path}: expected a JSON object of token text -> id, like {{"<|im_end|>": 163586}}')
    out: dict[str, int] = {}
    for key, value in data.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise InputError(f"{path}: {key!r}: expected an integer token id, got {value!r}")
        out[str(key)] = value
    return out


def run(args: argparse.Namespace) -> int:
    from app.tokens import get_profile, load_tokenizer
    from app.tokens.audit import audit_tokenizer

    profile = get_profile(args.profile)
    tokenizer = load_tokenizer(args.tokenizer, profile.pretokenizer_pattern)
    constants = load_constants(args.constants) if args.constants else None
    findings = audit_tokenizer(tokenizer, profile, constants)
    errors = [f for f in findings if f.level == "error"]
    if args.json:
        json.dump(
            {
                "ok": not errors,
                "tokenizer": str(tokenizer.path),
                "fingerprint": tokenizer.fingerprint,
                "profile": profile.name,
                "findings": [
                    {"level": f.level, "token": f.token, "id": f.token_id, "message": f.message} for f in findings
                ],
            },
            sys.stdout,
            ensure_ascii=False,
            indent=1,
        )
        sys.stdout.write("\n")
    else:
        out = sys.stdout
        out.write(
            f"tokenizer {tokenizer.path} ({tokenizer.kind}, vocab {tokenizer.vocab_size}, "
            f"fingerprint {tokenizer.fingerprint[:12]}), profile {profile.name}\n"
        )
        width = max((len(f.token) for f in findings), default=8)
        for f in findings:
            tid = "-" if f.token_id is None else str(f.token_id)
            out.write(f"  {f.level:<7} {f.token:<{width}} {tid:>8}  {f.message}\n")
        warnings = sum(f.level == "warning" for f in findings)
        out.write(f"{len(findings)} checked: {len(errors)} error(s), {warnings} warning(s)\n")
    if errors:
        raise EaglewatchError(f"audit failed: {len(errors)} error(s), first: {errors[0].message}", exit_code=1)
    return 0
