"""Run configuration: what loads, what each kind of mistake says, overrides, redaction."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.commands.config import to_toml
from app.config import RunConfig, apply_overrides, load_config, parse_config
from app.errors import InputError

MINIMAL = """\
[run]
name = "t"

[data]
reference = "ref.jsonl"

[[data.datasets]]
path = "prompts.jsonl"
format = "sharegpt"

[model]
name = "moonshotai/kimi-k2.5"
tokenizer = "tok"

[[endpoints]]
base_url = "https://openrouter.ai/api/v1"
api_key_env = "OPENROUTER_API_KEY"
"""


def write(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_config(path)
    return str(info.value)


def test_minimal_config_fills_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL))
    assert config.run.database == tmp_path / "eaglewatch.db"
    assert config.model.profile == "kimi-k2.5"
    assert config.generation.attempts == 4
    assert config.limits.lease_s == 600
    assert config.extraction.executor == "local"
    assert config.endpoints[0].name == "openrouter.ai"
    assert config.data.datasets[0].name == "prompts"
    assert config.source == tmp_path / "run.toml"


def test_relative_paths_resolve_against_the_config_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sub = tmp_path / "configs"
    sub.mkdir()
    write(sub, MINIMAL)
    monkeypatch.chdir(tmp_path)
    config = load_config(Path("configs") / "run.toml")  # a relative path to the file itself
    assert config.data.datasets[0].path == sub.resolve() / "prompts.jsonl"
    assert config.model.tokenizer == sub.resolve() / "tok"
    assert config.extraction.output_dir == sub.resolve() / "extract"


def test_sample_demo_config_is_valid(sample_data_dir: Path) -> None:
    config = load_config(sample_data_dir / "demo.toml")
    assert config.endpoints[0].simulator is not None
    assert config.endpoints[0].simulator.reference == config.data.reference


def test_config_is_frozen(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL))
    with pytest.raises(ValidationError):
        config.run.name = "other"  # type: ignore[misc]


def test_bad_base_url_names_file_key_and_problem(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL.replace("https://openrouter.ai/api/v1", "openrouter.ai"))
    assert msg == f"{tmp_path / 'run.toml'}: endpoints[0].base_url: must start with http:// or https://"


def test_unknown_key_is_an_error_listing_the_allowed_keys(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL.replace("[model]\n", "[model]\ntemprature = 1\n"))
    assert "model.temprature: unknown key (allowed here: name, tokenizer, profile)" in msg


def test_unknown_section_is_an_error(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL + "\n[genration]\nmax_tokens = 5\n")
    assert "genration: unknown key" in msg


def test_missing_required_key(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL.replace('tokenizer = "tok"\n', ""))
    assert msg.endswith("model.tokenizer: required key is missing")


def test_wrong_type_shows_the_value(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL + '\n[generation]\nmax_tokens = "lots"\n')
    assert "generation.max_tokens: input should be a valid integer" in msg
    assert "'lots'" in msg


def test_out_of_range_value(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL + "\n[generation]\ntop_p = 1.5\n")
    assert "generation.top_p: input should be less than or equal to 1" in msg


def test_bad_enum_value(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL.replace('format = "sharegpt"', 'format = "bogus"'))
    assert (
        "data.datasets[0].format: input should be 'openai-messages', 'sharegpt', 'specforge-conversations' or 'auto'"
        in msg
    )


def test_api_key_in_place_of_env_name_is_refused_without_echoing_it(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL.replace('"OPENROUTER_API_KEY"', '"sk-or-v1-secret"'))
    assert "endpoints[0].api_key_env: must be the NAME of an environment variable" in msg
    assert "sk-or-v1-secret" not in msg


def test_endpoint_needs_exactly_one_target(tmp_path: Path) -> None:
    both = MINIMAL + "\n[endpoints.simulator]\nseed = 1\n"
    assert "endpoints[0]: set exactly one of base_url or simulator" in error_of(tmp_path, both)
    neither = MINIMAL.replace('base_url = "https://openrouter.ai/api/v1"\n', "")
    assert "endpoints[0]: set exactly one of base_url or simulator" in error_of(tmp_path, neither)


def test_simulator_without_any_reference_is_refused(tmp_path: Path) -> None:
    text = MINIMAL.replace('reference = "ref.jsonl"\n', "").replace(
        'base_url = "https://openrouter.ai/api/v1"\napi_key_env = "OPENROUTER_API_KEY"\n', "[endpoints.simulator]\n"
    )
    assert "endpoints[0].simulator.reference: the simulator replays reference ids" in error_of(tmp_path, text)


def test_concurrency_bounds_must_be_ordered(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL + "\n[limits]\nconcurrency_min = 10\nconcurrency_max = 5\n")
    assert "limits: concurrency_min <= concurrency_initial <= concurrency_max must hold" in msg


def test_fault_rates_must_be_probabilities(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        'base_url = "https://openrouter.ai/api/v1"\napi_key_env = "OPENROUTER_API_KEY"\n',
        "[endpoints.simulator]\nfaults = { rate_limit = 2.0 }\n",
    )
    assert "endpoints[0].simulator.faults: Value error" not in error_of(tmp_path, text)
    assert "rate of fault 'rate_limit' must be between 0 and 1" in error_of(tmp_path, text)


def test_quoted_pricing_key_is_shown_quoted(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL + '\n[pricing."moonshotai/kimi-k2.5"]\nprompt_per_m = 1\n')
    assert 'pricing["moonshotai/kimi-k2.5"].completion_per_m: required key is missing' in msg


def test_every_error_is_reported_one_per_line(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL.replace("https://", "ftp://") + "\n[generation]\nattempts = 0\n")
    lines = msg.splitlines()
    assert len(lines) == 2
    assert all(line.startswith(str(tmp_path / "run.toml") + ": ") for line in lines)


def test_toml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    msg = error_of(tmp_path, '[run]\nname = "t"\nbroken line here\n')
    assert msg.startswith(f"{tmp_path / 'run.toml'}: line 3, column 8: invalid TOML:")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="nope.toml: no such file"):
        load_config(tmp_path / "nope.toml")


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_bytes(b'[run]\nname = "\xff"\n')
    with pytest.raises(InputError, match="is not UTF-8 text"):
        load_config(path)


def test_overrides_replace_values_and_resolve_paths_against_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(write(tmp_path, MINIMAL))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    new = apply_overrides(config, {"run.database": "x.db", "endpoints[0].weight": "2.5", "run.name": None})
    assert new.run.database == elsewhere / "x.db"
    assert new.endpoints[0].weight == 2.5
    assert new.run.name == "t"
    assert new.data.datasets[0].path == tmp_path / "prompts.jsonl"  # untouched paths stay put
    assert config.run.database == tmp_path / "eaglewatch.db"  # the original is unchanged


def test_override_of_unknown_key_or_bad_value_is_an_input_error(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL))
    with pytest.raises(InputError, match="run.nope: unknown key"):
        apply_overrides(config, {"run.nope": 1})
    with pytest.raises(InputError, match="limits.budget_usd: input should be a valid number"):
        apply_overrides(config, {"limits.budget_usd": "lots"})
    with pytest.raises(InputError, match="there is no"):
        apply_overrides(config, {"endpoints[3].weight": 1})


def test_redacted_keeps_env_names_and_masks_secret_extras(tmp_path: Path) -> None:
    text = (
        MINIMAL
        + 'extra = { provider = { order = ["moonshotai"] }, api_key = "sk-live", reasoning = { effort = "high" } }\n'
    )
    config = load_config(write(tmp_path, text))
    red = config.redacted()
    ep = red["endpoints"][0]
    assert ep["api_key_env"] == "OPENROUTER_API_KEY"
    assert ep["extra"]["api_key"] == "***"
    assert ep["extra"]["provider"] == {"order": ["moonshotai"]}
    assert "sk-live" not in repr(red)
    assert config.endpoints[0].extra["api_key"] == "sk-live"  # the config itself keeps what the file said


def test_effective_config_toml_round_trips(tmp_path: Path, sample_data_dir: Path) -> None:
    config = load_config(sample_data_dir / "demo.toml")
    text = to_toml(config.redacted())
    again = parse_config(tomllib.loads(text), base_dir=tmp_path)
    assert again.model_dump() == config.model_dump()


def test_parse_config_accepts_python_data() -> None:
    data = tomllib.loads(MINIMAL)
    config = parse_config(data, base_dir=Path("/base"))
    assert isinstance(config, RunConfig)
    assert config.model.tokenizer == Path("/base/tok")


def test_unknown_key_inside_nested_tables_lists_that_tables_keys(tmp_path: Path) -> None:
    text = MINIMAL + '\n[pricing."moonshotai/kimi-k2.5"]\nprompt_per_m = 1\ncompletion_per_m = 2\nbogus = 3\n'
    msg = error_of(tmp_path, text)
    assert (
        'pricing["moonshotai/kimi-k2.5"].bogus: unknown key (allowed here: prompt_per_m, completion_per_m, '
        "cached_prompt_per_m)" in msg
    )
    msg = error_of(tmp_path, MINIMAL.replace('format = "sharegpt"', 'format = "sharegpt"\nfromat = 1'))
    assert (
        "data.datasets[0].fromat: unknown key (allowed here: path, format, id_field, limit, sample_fraction, "
        "sample_seed, weight, columns, name, regenerate, on_tool_divergence)"
    ) in msg


def test_check_inputs_names_every_missing_path_with_its_key(tmp_path: Path, sample_data_dir: Path, monkeypatch) -> None:
    from app.datasets import check_inputs

    monkeypatch.setenv("OPENROUTER_API_KEY", "set")
    config = load_config(write(tmp_path, MINIMAL))
    errors = check_inputs(config).errors
    label = tmp_path / "run.toml"
    assert errors[0] == (
        f"{label}: data.datasets[0].path: {tmp_path / 'prompts.jsonl'} does not exist; fix the path "
        "(prompt file; relative paths are relative to the config file)"
    )
    assert errors[1].startswith(f"{label}: data.reference: {tmp_path / 'ref.jsonl'} does not exist")
    assert errors[2].startswith(f"{label}: model.tokenizer: tokenizer directory {tmp_path / 'tok'} does not exist")
    assert len(errors) == 3
    (tmp_path / "prompts.jsonl").write_text("")
    assert len(check_inputs(load_config(tmp_path / "run.toml")).errors) == 2
    demo = check_inputs(load_config(sample_data_dir / "demo.toml"))
    assert demo.errors == () and demo.warnings == () and demo.vocab_size and demo.references_checked > 100


def test_check_inputs_samples_reference_ids_against_the_vocabulary(
    tmp_path: Path, sample_tokenizer_dir: Path, monkeypatch
) -> None:
    from app.datasets import check_inputs

    monkeypatch.setenv("OPENROUTER_API_KEY", "set")
    (tmp_path / "prompts.jsonl").write_text("")
    text = MINIMAL.replace('tokenizer = "tok"', f'tokenizer = "{sample_tokenizer_dir}"')
    ref = tmp_path / "ref.jsonl"
    ref.write_text(
        '{"id": "a", "output_ids": [1, 2]}\n{"id": "b", "output_ids": [99999999]}\n{"id": "c", "output_ids": ["x"]}\n'
    )
    check = check_inputs(load_config(write(tmp_path, text)))
    assert check.errors == () and check.references_checked == 3
    (warning,) = check.warnings
    assert warning.startswith(
        "data.reference: 2 of all 3 lines checked are refused (ingest skips them), e.g. "
        f"{ref}:2: output id 99999999 is outside the tokenizer's vocabulary"
    )
    ref.write_text('{"id": "b", "output_ids": [99999999]}\n')  # every line refused: the wrong tokenizer
    (error,) = check_inputs(load_config(tmp_path / "run.toml")).errors
    assert "data.reference: every one of all 1 lines checked is refused" in error and "model.tokenizer" in error


def test_unknown_fault_kind_is_refused_naming_the_field(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        'base_url = "https://openrouter.ai/api/v1"\napi_key_env = "OPENROUTER_API_KEY"\n',
        "[endpoints.simulator]\nfaults = { rate_limt = 0.1 }\n",
    )
    msg = error_of(tmp_path, text)
    assert "endpoints[0].simulator: faults: unknown fault kind 'rate_limt'" in msg and "rate_limit" in msg
    msg = error_of(tmp_path, text.replace("faults = { rate_limt = 0.1 }", 'quirks = ["nope"]'))
    assert "endpoints[0].simulator: quirks: unknown quirk 'nope'" in msg


@pytest.mark.parametrize("bad", ["a\nb", "a/b", "a\\b", "tab\there", "esc\x1b[2J", "nul\x00", "ls\u2028x"])
def test_names_with_control_characters_or_separators_are_refused(tmp_path: Path, bad: str) -> None:
    import json

    quoted = json.dumps(bad)
    assert "run.name: " in error_of(tmp_path, MINIMAL.replace('name = "t"', f"name = {quoted}"))
    msg = error_of(tmp_path, MINIMAL.replace('format = "sharegpt"', f'format = "sharegpt"\nname = {quoted}'))
    assert "data.datasets[0].name: " in msg and "contains a" in msg
    msg = error_of(
        tmp_path, MINIMAL.replace('api_key_env = "OPENROUTER_API_KEY"', f'api_key_env = "K"\nname = {quoted}')
    )
    assert "endpoints[0].name: " in msg
    config = load_config(write(tmp_path, MINIMAL))
    with pytest.raises(InputError, match="command-line override: run.name: "):
        apply_overrides(config, {"run.name": bad})


def test_a_dataset_file_stem_that_is_not_a_name_asks_for_one(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL.replace('path = "prompts.jsonl"', 'path = "bad\\nname.jsonl"'))
    assert "data.datasets[0]: the file name stem" in msg and "set `name` for this dataset" in msg


def test_hostile_but_printable_names_are_kept(tmp_path: Path) -> None:
    import json

    name = "x; $(touch pwned) 'q\" `id`"
    config = load_config(write(tmp_path, MINIMAL.replace('name = "t"', f"name = {json.dumps(name)}")))
    assert config.run.name == name


def test_config_check_verb_fails_on_a_missing_path_and_passes_on_the_demo(
    tmp_path: Path, sample_data_dir: Path
) -> None:
    import subprocess
    import sys

    write(tmp_path, MINIMAL)
    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "config", "check", str(tmp_path / "run.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "data.datasets[0].path:" in out.stderr and "model.tokenizer:" in out.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "app.cli", "config", "check", str(sample_data_dir / "demo.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert "lines checked against the vocabulary" in ok.stdout


# `[run] reconstruct_workers` had an old name before issue 30, still read
OLD = "rebuild_workers"  # old name kept
OLD_WORKERS = MINIMAL.replace('name = "t"\n', f'name = "t"\n{OLD} = 3\n')
NEW_WORKERS = MINIMAL.replace('name = "t"\n', 'name = "t"\nreconstruct_workers = 3\n')


def test_the_old_name_of_reconstruct_workers_loads_the_same_value(tmp_path: Path) -> None:
    old = load_config(write(tmp_path, OLD_WORKERS, "old.toml"))
    new = load_config(write(tmp_path, NEW_WORKERS, "new.toml"))
    assert old.run.reconstruct_workers == new.run.reconstruct_workers == 3
    assert old.run.model_dump() == new.run.model_dump()  # nothing else of [run] differs
    assert old.run.deprecated_notes() == [
        f"[run] {OLD} is deprecated: it is the old name of reconstruct_workers (still accepted; rename it)"
    ]
    assert new.run.deprecated_notes() == []


def test_the_old_and_new_name_of_reconstruct_workers_at_once_is_an_error_naming_both(tmp_path: Path) -> None:
    msg = error_of(tmp_path, NEW_WORKERS.replace('name = "t"\n', f'name = "t"\n{OLD} = 2\n'))
    assert f"{OLD} and reconstruct_workers are both set" in msg
    assert msg.startswith(f"{tmp_path / 'run.toml'}: run")


def test_config_check_calls_the_old_name_deprecated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from app.commands.config import run

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "prompts.jsonl").write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    cfg = write(
        tmp_path,
        f'[run]\nname = "t"\n{OLD} = 0\n\n[[data.datasets]]\npath = "prompts.jsonl"\n\n'
        f'[model]\nname = "m"\ntokenizer = "{root / "sample_data" / "tokenizer"}"\n\n'
        '[[endpoints]]\nbase_url = "http://127.0.0.1:8000/v1"\n',
    )
    assert run(argparse.Namespace(action="check", file=str(cfg), json=False)) == 0
    out = capsys.readouterr().out
    assert f"# warning: [run] {OLD} is deprecated: it is the old name of reconstruct_workers" in out
    assert "reconstruct_workers = 0" in out  # the effective config says the new name
