"""Everything that can be checked is checked before anything is written or printed: credentials in a base_url, the
dataset's lines (named file:line:column), the API key's presence; `config check`, `ingest` and `run` alike."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.config import load_config, url_secret_problem
from app.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-or-v1-0123456789abcdef"


def eaglewatch(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full.pop("OPENROUTER_API_KEY", None) if env is None else None
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=full
    )


def write_config(tmp_path: Path, base_url: str, *, prompts: str | None = None, key_env: str | None = None) -> Path:
    (tmp_path / "prompts.jsonl").write_text(
        prompts if prompts is not None else '{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n'
    )
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        f'[run]\nname = "t"\ndatabase = "{tmp_path / "run.db"}"\n\n[[data.datasets]]\npath = "prompts.jsonl"\n\n'
        f'[model]\nname = "m"\ntokenizer = "{ROOT / "sample_data" / "tokenizer"}"\n\n'
        f'[[endpoints]]\nbase_url = "{base_url}"\n' + (f'api_key_env = "{key_env}"\n' if key_env else "")
    )
    return cfg


@pytest.mark.parametrize(
    "url",
    [
        f"https://user:{SECRET}@openrouter.ai/api/v1",
        f"https://{SECRET}@openrouter.ai/api/v1",
        f"https://openrouter.ai/api/v1?api-key={SECRET}",
        f"https://my.azure.example/openai?api-version=2024-06-01&api_key={SECRET}",
        f"https://gw.example/v1?access_token={SECRET}",
        f"https://gw.example/v1?sig={SECRET}&se=2030",
        f"https://gw.example/v1?key={SECRET}",
    ],
)
def test_a_key_in_base_url_is_refused_at_load_in_words_that_never_hold_it(tmp_path, url):
    with pytest.raises(InputError) as caught:
        load_config(write_config(tmp_path, url))
    text = str(caught.value)
    assert SECRET not in text and "base_url" in text and "api_key_env" in text


def test_a_query_without_a_credential_is_kept():
    assert url_secret_problem("https://my.azure.example/openai/v1?api-version=2024-06-01") is None
    assert url_secret_problem("http://127.0.0.1:8000/v1") is None


@pytest.mark.parametrize("verb", [["config", "check"], ["ingest"], ["run", "--headless"]])
def test_a_key_in_base_url_never_reaches_the_database_or_the_screen(tmp_path, verb):
    cfg = write_config(tmp_path, f"https://user:{SECRET}@openrouter.ai/api/v1?api-key={SECRET}")
    p = eaglewatch(*verb, str(cfg), cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert SECRET not in p.stdout + p.stderr
    assert "carries credentials" in p.stderr
    assert not (tmp_path / "run.db").exists()  # refused before anything was written


def test_config_check_names_bad_dataset_lines_by_file_line_and_column_and_counts_them(tmp_path):
    good = '{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n'
    cfg = write_config(
        tmp_path,
        "http://127.0.0.1:8000/v1",
        prompts=good
        + '{"id": "b", "messages": [{"role": "user", "content": "hi"},]}\n'
        + good.replace('"a"', '"c"')
        + '{"id": "d" "messages": []}\n',
    )
    p = eaglewatch("config", "check", str(cfg), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    prompts = tmp_path / "prompts.jsonl"
    assert "# datasets: all 4 lines checked" in p.stdout
    assert (
        f"# warning: data.datasets[0] (prompts): 2 of all 4 lines checked are refused (ingest skips them): "
        f"{prompts}:2:60: invalid JSON (Expecting value); {prompts}:4:12: invalid JSON "
        "(Expecting ',' delimiter)"
    ) in p.stdout


def test_a_dataset_whose_every_line_is_refused_stops_config_check_and_run_before_anything_is_written(tmp_path):
    cfg = write_config(
        tmp_path,
        "http://127.0.0.1:8000/v1",
        prompts='{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}\n' * 3,
    )
    for verb in (["config", "check"], ["run", "--headless"], ["ingest"]):
        p = eaglewatch(*verb, str(cfg), cwd=tmp_path)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (verb, p.stderr)
        assert "every one of all 3 lines checked is refused as openai-messages" in p.stderr
        assert f"{tmp_path / 'prompts.jsonl'}:1: 'messages' must be a non-empty list" in p.stderr
    assert not (tmp_path / "run.db").exists()


def test_a_missing_api_key_stops_run_before_anything_is_ingested_and_ingest_only_warns(tmp_path):
    cfg = write_config(tmp_path, "https://openrouter.ai/api/v1", key_env="EAGLEWATCH_TEST_ABSENT_KEY")
    env = {"EAGLEWATCH_TEST_ABSENT_KEY": ""}
    for verb in (["config", "check"], ["run", "--headless"]):
        p = eaglewatch(*verb, str(cfg), cwd=tmp_path, env=env)
        assert p.returncode == 2, p.stderr
        assert (
            "endpoints[0].api_key_env: the environment variable EAGLEWATCH_TEST_ABSENT_KEY (endpoint "
            "'openrouter.ai') is not set or empty; export it before starting the run"
        ) in p.stderr
        assert not (tmp_path / "run.db").exists()
    p = eaglewatch("ingest", str(cfg), cwd=tmp_path, env=env)  # ingest sends nothing: it goes on
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "run.db").exists()
