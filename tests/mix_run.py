"""A real run database with a mix: three datasets, one of them with a category column, prompts in three scripts,
answers with reasoning and with tool calls, written through the store API (`status` and the monitor read it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.records import Completion, Reconstruction, ToolCall, Usage
from app.store.run_store import RunStore
from app.store.store_records import ResultRecord, SampleInput

PROMPTS = {"Latin": "Explain the NOR gate.", "CJK": "请解释或非门。", "Cyrillic": "Объясни вентиль ИЛИ-НЕ."}


@dataclass(frozen=True, slots=True)
class MixPart:
    """`prompts` samples of one (dataset, category) in `script`; the first `answers` answered with `tokens` output
    tokens each, the first `reasoning` of those with reasoning and the first `tool_calls` with a tool call."""

    dataset: str
    category: str | None
    script: str
    prompts: int
    answers: int
    tokens: int
    reasoning: int = 0
    tool_calls: int = 0


# 40 prompts, 30 answers, 2,800 loss tokens; `ultrachat-200k-train-sft` is longer than the monitor's name column
MIX = (
    MixPart("ultrachat-200k-train-sft", None, "Latin", 16, 12, 50, reasoning=3),
    MixPart("openthoughts", "code", "Latin", 8, 6, 200, reasoning=6),
    MixPart("openthoughts", "math", "Cyrillic", 4, 4, 150, reasoning=4),
    MixPart("kimi-tool-use", None, "CJK", 8, 6, 50, tool_calls=3),
    MixPart("kimi-tool-use", None, "Latin", 4, 2, 50, tool_calls=2),
)


async def build_mix_db(path: Path, run_name: str = "mix") -> Path:
    """Write MIX as a paused run at `path` (a category only where a part has one; the unanswered prompts pending)."""
    store = await RunStore.open(path)
    try:
        run_id = await store.ensure_run(run_name, {"model": {"tokenizer": "unused"}})
        inputs, plan = [], {}
        for p, part in enumerate(MIX):
            for i in range(part.prompts):
                sid = f"{part.dataset}-{p}-{i}"
                inputs.append(
                    SampleInput(
                        sid,
                        part.dataset,
                        [{"role": "user", "content": f"{PROMPTS[part.script]} ({i})"}],
                        category=part.category,
                        language=part.script,
                    )
                )
                plan[sid] = (part, i)
        await store.ingest(run_id, inputs)
        unanswered = []
        for sample in await store.lease(run_id, len(inputs), 600):
            part, i = plan[sample.sample_id]
            if i >= part.answers:
                unanswered.append(sample.pk)
                continue
            calls = (ToolCall(f"call-{i}", "lookup", '{"q": "nor"}'),) if i < part.tool_calls else ()
            completion = Completion(
                content="A NOR gate outputs 1 only when both inputs are 0.",
                reasoning="thinking about gates" if i < part.reasoning else None,
                tool_calls=calls,
                finish_reason="tool_calls" if calls else "stop",
                usage=Usage(prompt_tokens=10, completion_tokens=part.tokens),
                total_s=1.0,
            )
            ids = tuple(range(part.tokens))
            await store.record_result(
                ResultRecord(run_id, sample.pk, 1, "sim", completion, 0.001, Reconstruction(ids, "canonical"))
            )
        await store.release(run_id, unanswered)
        await store.set_run_state(run_id, "paused", "operator")
    finally:
        await store.close()
    return path
