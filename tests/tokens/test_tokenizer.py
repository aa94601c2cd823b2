"""Tokenizer backends: HF tokenizer.json and tiktoken (Kimi), loading errors, fingerprints."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from app.errors import InputError
from app.tokens import KIMI_PATTERN, load_tokenizer
from tests.tokens.conftest import build_tiktoken_dir

KIMI_WORKED = (
    "Let me check the weather.</think>I'll look it up.<|tool_calls_section_begin|><|tool_call_begin|>"
    'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Beijing"}<|tool_call_end|>'
    "<|tool_calls_section_end|><|im_end|>"
)
KIMI_WORKED_IDS = [
    9413,
    1019,
    2598,
    276,
    10666,
    13,
    163607,
    65447,
    1799,
    483,
    979,
    13,
    163595,
    163597,
    41937,
    1150,
    21055,
    2800,
    25,
    15,
    163598,
    8264,
    37666,
    1289,
    414,
    4396,
    39556,
    16934,
    163599,
    163596,
    163586,
]


def test_sample_tokenizer_encodes_markers_as_single_ids(sample_tok):
    eot = sample_tok.special_id("<|im_end|>")
    assert eot is not None
    assert sample_tok.encode("hi<|im_end|>")[-1] == eot
    assert sample_tok.decode(sample_tok.encode("héllo 世界 🙂</think>")) == "héllo 世界 🙂</think>"


def test_sample_tokenizer_token_bytes_are_exact(sample_tok):
    ids = sample_tok.encode("世界 🙂 plain text")
    assert b"".join(sample_tok.token_bytes(i) for i in ids) == "世界 🙂 plain text".encode()
    assert sample_tok.id_of_bytes(sample_tok.token_bytes(ids[0])) == ids[0]


def test_sample_tokenizer_encodes_as_the_tokenizers_library_does(sample_tok):
    # encode goes through encode_batch_fast (no offsets): the ids must be what Tokenizer.encode gives
    texts = [
        "",
        "plain text",
        "héllo 世界 🙂</think>",
        "a<|im_end|>b  \n\n\tc",
        "e\u0301 decomposed",
        "x" * 3000,
        "<think>\nstep 1: 2+2=4</think>The answer is 4.<|im_end|>",
    ]
    for text in texts:
        assert sample_tok.encode(text) == sample_tok.backend.encode(text, add_special_tokens=False).ids, text


def test_encode_ordinary_keeps_marker_text_as_plain_tokens(sample_tok):
    ids = sample_tok.encode_ordinary("<|im_end|>")
    assert len(ids) > 1 and not any(sample_tok.is_special(i) for i in ids)
    assert sample_tok.decode(ids) == "<|im_end|>"


def test_fingerprint_is_stable_and_changes_with_the_files(tmp_path):
    a = load_tokenizer(build_tiktoken_dir(tmp_path / "a"))
    b = load_tokenizer(build_tiktoken_dir(tmp_path / "b"))
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
    (tmp_path / "b" / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {}}))
    assert load_tokenizer(tmp_path / "b").fingerprint != a.fingerprint


def test_tiktoken_backend_names_unnamed_slots_reserved(tmp_path):
    tok = load_tokenizer(build_tiktoken_dir(tmp_path / "t"))
    base = tok.vocab_size - 256
    assert tok.special_id(f"<|reserved_token_{base}|>") == base
    assert tok.special_id("<|im_end|>") == base + 2
    assert tok.decode([base + 2]) == "<|im_end|>"


def test_tiktoken_backend_agrees_with_tiktoken(tmp_path):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    d = build_tiktoken_dir(tmp_path / "t")
    tok = load_tokenizer(d)
    ranks = load_tiktoken_bpe(str(d / "tiktoken.model"))
    base = len(ranks)
    specials = {t: i for t, i in tok.special_tokens().items()}
    enc = tiktoken.Encoding("ref", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=specials)
    text = "hello world chas<|im_end|> hello 世界<think>x</think>"
    assert tok.encode(text) == enc.encode(text, allowed_special="all")
    assert tok.vocab_size == base + 256


def test_missing_directory_is_a_sentence(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")


def test_directory_without_tokenizer_files_is_a_sentence(tmp_path):
    with pytest.raises(InputError, match="neither tokenizer.json nor tiktoken.model"):
        load_tokenizer(tmp_path)


def test_broken_tiktoken_model_names_the_line(tmp_path):
    (tmp_path / "tiktoken.model").write_text("aGk= 0\nnot-a-line\n")
    with pytest.raises(InputError, match=r"tiktoken.model:2:"):
        load_tokenizer(tmp_path)


def test_broken_tokenizer_json_names_the_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{ nope")
    with pytest.raises(InputError, match=r"tokenizer.json:1: not valid JSON"):
        load_tokenizer(tmp_path)


@pytest.mark.kimi
def test_kimi_special_ids(kimi_tok):
    expected = {
        "<|im_end|>": 163586,
        "</think>": 163607,
        "<think>": 163606,
        "<|tool_calls_section_begin|>": 163595,
        "<|tool_call_begin|>": 163597,
        "<|tool_call_argument_begin|>": 163598,
        "<|tool_call_end|>": 163599,
        "<|tool_calls_section_end|>": 163596,
        "[BOS]": 163584,
        "[EOS]": 163585,
    }
    assert {t: kimi_tok.special_id(t) for t in expected} == expected
    assert kimi_tok.vocab_size == 163840


@pytest.mark.kimi
def test_kimi_163533_decodes_to_chas(kimi_tok):
    assert kimi_tok.decode([163533]) == "chas"
    assert kimi_tok.token_bytes(163533) == b"chas"
    assert not kimi_tok.is_special(163533)


@pytest.mark.kimi
def test_kimi_worked_example_encodes_to_the_reference_ids(kimi_tok):
    assert kimi_tok.encode(KIMI_WORKED) == KIMI_WORKED_IDS
    assert kimi_tok.decode(KIMI_WORKED_IDS) == KIMI_WORKED


@pytest.mark.kimi
def test_kimi_loads_without_importing_transformers(kimi_tokenizer_dir):
    code = (
        "import sys; from app.tokens import load_tokenizer; "
        f"t = load_tokenizer({str(kimi_tokenizer_dir)!r}); "
        "assert t.special_id('<|im_end|>') == 163586; print('transformers' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip() == "False"


@pytest.mark.kimi
def test_kimi_backend_agrees_with_tiktoken_itself(kimi_tok):
    text = "Hello 世界! 🙂 <think>x</think> don't\n\n  code(1234567) <|im_end|> tail\ud800"
    want = kimi_tok.encoding.encode(text, allowed_special="all")
    assert kimi_tok.encode(text) == want
    assert kimi_tok.encode_ordinary(text) == kimi_tok.encoding.encode_ordinary(text)
