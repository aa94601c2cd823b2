"""The simulator replays the repo's sample reference exactly: every prompt gets its own ids and text."""

from __future__ import annotations

import json

import pytest

from app.providers import ChatClient
from app.simulator import SimulatorOptions, SimulatorServer
from app.tokens import get_profile, split_output
from tests.providers.support import Endpoint, Generation


@pytest.fixture(scope="module")
def samples(sample_reference):
    if not sample_reference.exists():
        pytest.skip("sample_data/reference.jsonl is not built yet")
    return [json.loads(line) for line in sample_reference.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("stream", [False, True])
async def test_every_sample_comes_back_as_split_output_says(tok, sample_reference, samples, stream):
    profile = get_profile("kimi-k2.5")
    chosen = samples[::2] if not stream else samples[1::6]
    async with SimulatorServer(SimulatorOptions(), tokenizer=tok, reference=sample_reference) as sim:
        gen = Generation(stream=stream, logprobs=True, max_tokens=None)
        async with ChatClient(Endpoint(), gen, None, base_url=sim.base_url) as client:
            for sample in chosen:
                completion = await client.complete(sample["messages"], model="kimi", extra={"return_token_ids": True})
                view = split_output(sample["output_ids"], profile, tok)
                assert completion.token_ids == tuple(sample["output_ids"]), sample["id"]
                reasoning = completion.reasoning
                if stream and reasoning is None and view.reasoning == "":
                    reasoning = ""  # a stream has no delta for empty reasoning: "" and None look alike
                assert (reasoning, completion.content, completion.finish_reason) == (
                    view.reasoning,
                    view.content or "",
                    view.finish_reason,
                ), sample["id"]
                assert [(c.id, c.arguments) for c in completion.tool_calls] == [
                    (c.id, c.arguments) for c in view.tool_calls
                ], sample["id"]
                content_bytes = b"".join(bytes(lp.bytes) for lp in completion.content_logprobs or ())
                assert content_bytes == completion.content.encode(), sample["id"]


async def test_all_quirks_stream_and_plain_agree_on_every_kind(tok, sample_reference, samples):
    from app.simulator import QUIRKS

    async with SimulatorServer(SimulatorOptions(quirks=list(QUIRKS)), tokenizer=tok, reference=sample_reference) as sim:
        async with (
            ChatClient(Endpoint(), Generation(), None, base_url=sim.base_url) as plain_client,
            ChatClient(Endpoint(), Generation(stream=True), None, base_url=sim.base_url) as stream_client,
        ):
            for sample in samples[::4]:
                a = await plain_client.complete(sample["messages"], model="kimi")
                b = await stream_client.complete(sample["messages"], model="kimi")
                assert (a.reasoning or "", a.content, a.tool_calls, a.finish_reason) == (
                    b.reasoning or "",
                    b.content,
                    b.tool_calls,
                    b.finish_reason,
                ), sample["id"]
