"""The server steps table as prior profiles, and what a reconstruction proves without ground truth: a strip edge is
flagged exactly when the token count cannot rule out that whitespace was removed there; a reconstructed count other
than usage.completion_tokens is flagged; probes override the prior where they saw something."""

from __future__ import annotations

from app.providers.servers import server_from_models
from app.records import Completion, ToolCall, Usage
from app.tokens import Reconstructor, get_profile
from app.tokens.fidelity_profile import STRIPPED, FidelityProfile, plan_key
from app.tokens.flags import TOKEN_COUNT, UNINVERTIBLE
from app.tokens.server_steps import known_steps, prior_profile

QWEN = get_profile("qwen3")
STRIP = UNINVERTIBLE + "strip_whitespace"


def _rec(tok, server: str, stream: bool) -> Reconstructor:
    return Reconstructor(QWEN, tok, prior_profile(server, stream, QWEN, "serve"))


def _truth(rec: Reconstructor, text: str) -> list[int]:
    return rec.tokenizer.encode(text)


def test_transformers_serve_streaming_raw_regions_reconstruct_exactly_and_a_counted_end_is_proven(nfc_qwen_tokenizer):
    rec = _rec(nfc_qwen_tokenizer, "transformers-serve", True)
    truth = _truth(rec, "<think>\nThe user greets me.\n</think>\n\nHello! How can I help you today?<|im_end|>")
    streamed = Completion(
        content="\n\nHello! How can I help you today?",
        reasoning="\nThe user greets me.\n",
        finish_reason="stop",
        usage=Usage(completion_tokens=len(truth)),
    )
    out, _ = rec.process(streamed)
    assert list(out.output_ids) == truth
    assert "template_whitespace_kept" in (out.repair or "") and not out.flags  # the count rules out a lost "\n"
    # one token more than the reconstruction: something was lost on the way (here a trailing newline)
    lost = Completion(
        content=streamed.content,
        reasoning=streamed.reasoning,
        finish_reason="stop",
        usage=Usage(completion_tokens=len(truth) + 1),
    )
    flags = rec.process(lost)[0].flags
    assert TOKEN_COUNT in flags and STRIP in flags


def test_a_leading_space_a_stripping_server_may_have_eaten_is_flagged_even_when_the_count_agrees(nfc_qwen_tokenizer):
    rec = _rec(nfc_qwen_tokenizer, "transformers-serve", False)
    for model_said in (" increasing values follow.", "increasing values follow."):
        truth = _truth(rec, f"<think>\nA number.\n</think>\n\n{model_said}<|im_end|>")
        served = Completion(
            content="increasing values follow.",
            reasoning="A number.",
            finish_reason="stop",
            usage=Usage(completion_tokens=len(truth)),
        )
        out, _ = rec.process(served)
        # "\n\n" + " increasing" and "\n\n" + "increasing" can be as many tokens: text cannot tell, so flagged
        assert STRIP in out.flags, (model_said, out.flags)


def test_without_a_count_relation_every_strip_edge_is_flagged(nfc_qwen_tokenizer):
    fp = FidelityProfile("e", None, "qwen3", 0, {}, {"edge:content.trail": {STRIPPED: 1}}, "a stripping server")
    rec = Reconstructor(QWEN, nfc_qwen_tokenizer, fp)
    c = Completion(content="Done.", reasoning="r", finish_reason="stop", usage=Usage(completion_tokens=99))
    assert STRIP in rec.process(c)[0].flags


def test_probes_override_the_prior_where_they_saw_something():
    prior = {"edge:content.trail": {STRIPPED: 1}, "edge:content.lead": {STRIPPED: 1}}
    # the probes saw whitespace kept at the trailing edge ("="), and nothing either way at the leading one
    fp = FidelityProfile(
        "e", None, "qwen3", 3, {"edge:content.trail": {"=": 2, "": 1}, "edge:content.lead": {"": 3}}, prior, "table"
    )
    steps = {s.where: s for s in fp.steps()}
    assert "content.trail" not in steps  # corrected by the probes
    assert steps["content.lead"].prior and not steps["content.lead"].invertible  # the prior stands
    assert plan_key(fp) != plan_key(FidelityProfile("e", None, "qwen3", 0, {}, prior, "table"))


def test_json_arguments_are_restyled_as_the_model_writes_them(nfc_qwen_tokenizer):
    rec = _rec(nfc_qwen_tokenizer, "transformers-serve", True)
    text = (
        '<think>\nZurich.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}'
        "\n</tool_call><|im_end|>"
    )
    truth = _truth(rec, text)
    served = Completion(
        content="",
        reasoning="\nZurich.\n",
        finish_reason="tool_calls",
        tool_calls=(ToolCall("x", "get_weather", '{"city": "Z\\u00fcrich"}'),),
        usage=Usage(completion_tokens=len(truth)),
    )
    assert list(rec.process(served)[0].output_ids) == truth


def test_the_table_knows_what_ground_truth_each_server_gives():
    assert known_steps("vllm", True, QWEN).truth == "ids"
    assert known_steps("sglang", True, QWEN).truth == "logprobs" and known_steps("sglang", False, QWEN).truth == "ids"
    assert known_steps("transformers-serve", False, QWEN).truth == "none"
    assert "stream" in known_steps("transformers-serve", False, QWEN).other_path
    assert known_steps("transformers-serve", True, get_profile("kimi-k2.5")) is None  # no response parser for it
    assert known_steps("llama.cpp", True, QWEN) is None


def test_servers_are_identified_from_their_models_listing():
    assert server_from_models({"data": [{"id": "m", "owned_by": "vllm", "max_model_len": 4096}]}) == "vllm"
    assert server_from_models({"data": [{"id": "m", "owned_by": "sglang"}]}) == "sglang"
    ts = {"data": [{"id": "/models/q", "owned_by": "local", "object": "model", "status": {"value": "loaded"}}]}
    assert server_from_models(ts, {"X-Request-Id": "abc"}) == "transformers-serve"
    assert server_from_models(ts, {}) is None  # the listing alone is not enough
    assert server_from_models({"data": [{"id": "a/b", "pricing": {}, "architecture": {}}]}) == "openrouter"
    assert server_from_models({"data": [{"id": "m", "owned_by": "someone"}]}) is None
    assert server_from_models("not json") is None
