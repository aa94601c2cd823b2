"""A training row is ids plus the spans of them the model generated; a row with several spans (a multi-turn
conversation's regenerated turns) goes through every pre-tokenized and text writer with all its spans."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from app.export.training_rows import TrainingRow
from app.export.writers import make_writer
from app.tokens import get_profile, load_tokenizer


@pytest.fixture(scope="module")
def two_turns(sample_reference, sample_tokenizer_dir):
    """Turn 1's prompt and output, the next user turn, turn 2's output: two generated spans."""
    tok = load_tokenizer(sample_tokenizer_dir)
    records = [json.loads(line) for line in sample_reference.read_text().splitlines()[:2]]
    first, second = (r["output_ids"] for r in records)
    prompt = tok.encode("<|im_user|>user<|im_middle|>Hello?<|im_end|><|im_assistant|>assistant<|im_middle|><think>")
    between = tok.encode("<|im_user|>user<|im_middle|>And then?<|im_end|><|im_assistant|>assistant<|im_middle|><think>")
    ids = [*prompt, *first, *between, *second]
    a = len(prompt)
    b = a + len(first) + len(between)
    source = SimpleNamespace(sample_id="conv-1", messages=[], tools=None, category="exact", finish_reason="stop")
    row = TrainingRow("conv-1", ids, ((a, a + len(first)), (b, len(ids))), "reference", "exact", source, "conv")
    return tok, row


def test_the_mask_and_chunks_follow_the_spans(two_turns):
    _, row = two_turns
    (a, a_end), (b, _) = row.loss_spans
    assert row.loss_mask == [0] * a + [1] * (a_end - a) + [0] * (b - a_end) + [1] * (len(row.input_ids) - b)
    assert [generated for generated, _ in row.chunks()] == [False, True, False, True]
    assert [i for _, ids in row.chunks() for i in ids] == row.input_ids
    assert row.loss_tokens == sum(row.loss_mask)


def test_spans_out_of_order_or_outside_the_ids_are_refused():
    with pytest.raises(ValueError, match="not ordered, disjoint"):
        TrainingRow("x", [1, 2, 3], ((1, 3), (0, 1)), "text", None)
    with pytest.raises(ValueError, match="not ordered, disjoint"):
        TrainingRow("x", [1, 2, 3], ((1, 4),), "text", None)


@pytest.mark.parametrize("fmt", ["eagle3-shards", "speculators", "specforge"])
def test_pretokenized_writers_keep_every_span(two_turns, tmp_path, fmt):
    tok, row = two_turns
    writer = make_writer(fmt, tmp_path, tok, get_profile("kimi-k2.5"), 10)
    assert writer.write(row) is None
    [entry] = writer.close()
    [record] = [json.loads(line) for line in (tmp_path / entry["path"]).read_text().splitlines()]
    assert (record["input_ids"], record["loss_mask"]) == (row.input_ids, row.loss_mask)


def test_modelopt_rows_carry_each_span_as_an_assistant_message(two_turns, tmp_path, hf_sample_tokenizer):
    """transformers' apply_chat_template over the written messages with the exported template gives the row's
    ids and its two-span mask."""
    tok, row = two_turns
    writer = make_writer("modelopt", tmp_path, tok, get_profile("kimi-k2.5"), 10)
    assert writer.write(row) is None
    writer.close()
    [record] = [json.loads(line) for line in (tmp_path / "data" / "modelopt.jsonl").read_text().splitlines()]
    assert [m["role"] for m in record["messages"]] == ["user", "assistant", "user", "assistant"]
    out = hf_sample_tokenizer.apply_chat_template(
        record["messages"],
        chat_template=(tmp_path / "chat_template.jinja").read_text(),
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    assert (out["input_ids"], out["assistant_masks"]) == (row.input_ids, row.loss_mask)


def test_specforge_text_measures_a_multi_span_row_against_its_last_turn_mask(two_turns, tmp_path):
    """SpecForge's last-turn mask holds only the final span (plus K2.5's prefilled `<think>`): the difference,
    the whole first span and the one prefill token, is measured and warned, never silent."""
    tok, row = two_turns
    writer = make_writer("specforge-text", tmp_path, tok, get_profile("kimi-k2.5"), 10)
    assert writer.write(row) is None
    writer.close()
    first = row.loss_spans[0][1] - row.loss_spans[0][0]
    assert (writer.mask_samples, writer.mask_tokens) == (1, first + 1)
    assert writer.warnings() and "1 of 1 samples" in writer.warnings()[0]
