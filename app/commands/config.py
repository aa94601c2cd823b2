"""`eaglewatch config check FILE`: validate a run config, check what it names on disk, print the effective config.

The check is `app.datasets.check_inputs` (the same `run` and `ingest` run before writing): dataset and
reference files exist and are readable, every dataset line parses in its format (bad ones counted, the first
few named as file:line:column), the tokenizer directory loads, a sample of reference lines parse with ids
inside the vocabulary, the database can be created or written where the config puts it, and each endpoint's
API key variable is set. An error exits 2 with `file: key: problem; what to do` lines.

The printout is TOML with every default filled in and every path resolved; secrets never appear
(keys live in environment variables named by `api_key_env`, whose presence is noted, never the value; a
base_url that carries a credential is refused when the file is loaded, before anything is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

EXAMPLE = """\
eaglewatch config check sample_data/demo.toml
eaglewatch config check my-run.toml --json | jq .limits
eaglewatch config reference            # every key, type and default (Markdown)"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action", choices=("check", "reference"), help="check: validate FILE; reference: list every key"
    )
    parser.add_argument("file", nargs="?", metavar="FILE", help="run config TOML (for check)")
    parser.add_argument("--json", action="store_true", help="print the effective configuration as JSON")


def run(args: argparse.Namespace) -> int:
    from app.config import config_reference_markdown, load_config
    from app.errors import InputError

    if args.action == "reference":
        sys.stdout.write(config_reference_markdown())
        return 0
    if not args.file:
        raise InputError("config check needs the path of a run config TOML file, e.g. sample_data/demo.toml")
    from app.datasets import check_inputs

    config = load_config(args.file)
    data = config.redacted()
    keys = {ep["name"]: ep.get("api_key_env") for ep in data["endpoints"]}
    inputs = check_inputs(config, dataset_sample=None)
    deprecated = config.run.deprecated_notes()
    if args.json:
        payload = {
            "ok": not inputs.errors,
            "file": str(config.source),
            "config": data,
            "api_keys": {name: _key_state(env) for name, env in keys.items()},
            "errors": list(inputs.errors),
            "warnings": deprecated + list(inputs.warnings),
            "references_checked": inputs.references_checked,
            "vocab_size": inputs.vocab_size,
            "dataset_lines_checked": inputs.dataset_lines_checked,
            "readings": [str(r) for r in inputs.readings],
        }
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return 2 if inputs.errors else 0
    if inputs.errors:
        raise InputError("\n".join(inputs.errors) + "\n(`run` and `ingest` refuse this config until these are fixed)")
    out = [
        f"# {config.source}: valid",
        "# effective configuration (defaults filled in, paths resolved, secrets redacted)",
    ]
    for name, env in keys.items():
        if env:
            out.append(f"# endpoint {name!r}: API key from ${env} ({_key_state(env)})")
    out.append(f"# datasets: all {inputs.dataset_lines_checked} lines checked")
    for reading in inputs.readings:  # what was guessed (format "auto" or not set), so the config can say otherwise
        out.append(f"# read {reading}")
    if inputs.vocab_size is not None:
        out.append(f"# model.tokenizer: loads, vocabulary of {inputs.vocab_size} tokens")
    if inputs.references_checked:
        out.append(
            f"# reference ids: {inputs.references_checked} lines checked against the vocabulary "
            "(a sample; ingest checks every line)"
        )
    for line in deprecated + list(inputs.warnings):
        out.append(f"# warning: {line}")
    out += price_lines(config)
    out.append("")
    out.append(to_toml(data))
    sys.stdout.write("\n".join(out))
    return 0


def price_lines(config: Any) -> list[str]:
    """`# prices: ...` for the model (variants resolve to their base), or a warning when it has none."""
    from app.providers.pricing import PriceQuote, resolve_pricing

    pricing, key = resolve_pricing(config.model.name, config.pricing)
    if pricing is not None:
        return [f"# prices: {PriceQuote(config.model.name, pricing, 'config', key).describe()}"]
    return [
        f'# warning: no [pricing."{config.model.name}"] (nor for its base model); the run asks each '
        "endpoint's GET /models at start, else counts only API-reported cost and the budget guard has no "
        "estimate before the first result"
    ]


def _key_state(env: str | None) -> str:
    if not env:
        return "no key needed"
    return "set" if os.environ.get(env) else "NOT SET in this environment"


def to_toml(data: dict[str, Any]) -> str:
    """Render JSON-like data as TOML (None values become comments, since TOML has no null)."""
    lines: list[str] = []
    _table(lines, [], data)
    return "\n".join(lines).strip() + "\n"


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def _val(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_val(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_val(x)}" for k, x in v.items() if x is not None) + " }"
    return json.dumps(v)


def _is_table_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _table(lines: list[str], path: list[str], data: dict[str, Any], array: bool = False) -> None:
    name = ".".join(_key(p) for p in path)
    if path:
        lines.append("")
        lines.append(f"[[{name}]]" if array else f"[{name}]")
    nested = []
    for k, v in data.items():
        if v is None:
            lines.append(f"# {_key(k)} = (unset)")
        elif isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
            nested.append((k, v))
        elif isinstance(v, dict) and path == []:
            nested.append((k, v))
        elif _is_table_list(v):
            nested.append((k, v))
        elif isinstance(v, dict) and any(isinstance(x, dict) for x in v.values()):
            nested.append((k, v))
        else:
            lines.append(f"{_key(k)} = {_val(v)}")
    for k, v in nested:
        if isinstance(v, list):
            for item in v:
                _table(lines, [*path, k], item, array=True)
        else:
            _table(lines, [*path, k], v)
