"""Build a tiny Qwen3-layout model folder that `transformers serve` can load offline.

The folder holds a byte-level BPE `tokenizer.json` trained here on a small corpus, carrying Qwen3's markers
(`<|im_start|>`, `<|im_end|>`, `<think>`, `</think>`, `<tool_call>`, `</tool_call>`, `<|endoftext|>`, with
Qwen3's special flags) and Qwen3's NFC normaliser (so the server's prompt encoding normalises text such as
U+F981 to U+5973 before BPE, as the real Qwen3 tokenizer does), a chat template written for this test from the Qwen3
layout in
../shared/reference/tokenization.md §2 (ChatML turns, `<tools>` JSON lines in the system turn, the
generation prompt `<|im_start|>assistant\\n`, Hermes `<tool_call>` JSON), and a two-layer `Qwen3ForCausalLM`
trained for a few hundred CPU steps to emit the Qwen3 output layout (`<think>\\n…\\n</think>\\n\\n…`, tool
calls) for a handful of prompts, so greedy decoding exercises reasoning, content and tool calls. Ground truth
is always taken from `model.generate`, never from the training targets. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

MARKERS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<think>", False),
    ("</think>", False),
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

# (messages, tools, the output the model is trained to emit). Tool arguments in json.dumps style, as Qwen3.
CASES = [
    (
        [{"role": "user", "content": "Say hello."}],
        None,
        "<think>\nThe user greets me. I answer briefly.\n</think>\n\nHello! How can I help you today?<|im_end|>",
    ),
    (
        [{"role": "user", "content": "What is two plus two?"}],
        None,
        "<think>\nTwo plus two is four.\n</think>\n\n2 + 2 = 4.<|im_end|>",
    ),
    (
        [{"role": "user", "content": "Weather in Paris?"}],
        [WEATHER_TOOL],
        '<think>\nI should call the tool.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>',
    ),
    (
        [{"role": "user", "content": "Weather in Beijing, briefly?"}],
        [WEATHER_TOOL],
        '<think>\nCall the tool for Beijing.\n</think>\n\nLet me check.\n<tool_call>\n{"name": "get_weather", '
        '"arguments": {"city": "Beijing"}}\n</tool_call><|im_end|>',
    ),
    # a tool-call region that is not JSON: transformers serve answers 500 to it (non-streaming)
    (
        [{"role": "user", "content": "Break the tool."}],
        [WEATHER_TOOL],
        "<think>\nI will break it.\n</think>\n\n<tool_call>\nnot json at all\n</tool_call><|im_end|>",
    ),
    (
        [{"role": "user", "content": "Write a long story."}],
        None,
        "<think>\nA long story about a fox who walks to the city and back again, slowly.\n</think>\n\nOnce upon a "
        "time a quick brown fox jumped over the lazy dog, and then it ran to Paris.<|im_end|>",
    ),
]

# What only the vLLM variant (head_dim 32) is trained on besides CASES: the outputs where vLLM's parsers change
# the text most. vLLM's qwen3 reasoning parser starts inside reasoning, so an answer with no think block comes back
# whole as `reasoning`; its hermes tool parser re-serialises non-streamed arguments with json.dumps(...,
# ensure_ascii=False), which turns the model's `\u00fc` escape into `ü`.
VLLM_CASES = [
    ([{"role": "user", "content": "Answer at once: ok?"}], None, "Ok, at once.<|im_end|>"),
    (
        [{"role": "user", "content": "Weather in Z\u00fcrich?"}],
        [WEATHER_TOOL],
        '<think>\nCall the tool for Zurich.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Z\\u00fcrich"}}\n</tool_call><|im_end|>',
    ),
    (
        [{"role": "user", "content": "Weather in Oslo, no thinking?"}],
        [WEATHER_TOOL],
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>',
    ),
]

# The Qwen3 layout as a Jinja chat template (tokenization.md §2), written for this test.
CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    # the last user turn that is not a tool result: an assistant turn after it (a tool-call loop in progress)
    # keeps its reasoning, as Qwen3's template does (loop.index0 > ns.last_query_index)
    "{%- set ns = namespace(last_query=messages|length - 1, found=false) %}"
    "{%- for message in messages[::-1] %}"
    "{%- if not ns.found and message.role == 'user' and not (message.content.startswith('<tool_response>') "
    "and message.content.endswith('</tool_response>')) %}"
    "{%- set ns.found = true %}{%- set ns.last_query = messages|length - 1 - loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content or '' %}{%- set reasoning = message.reasoning_content or '' %}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{%- for tc in message.tool_calls or [] %}"
    "{%- if (loop.first and content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- set f = tc.function if tc.function else tc %}"
    '{{- \'<tool_call>\\n{"name": "\' + f.name + \'", "arguments": \' }}'
    "{%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"  # consecutive tool results share one user turn, as in Qwen3's template
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Let me check the weather in Paris and Beijing.",
    "Okay, the user wants weather. I should call the tool with the city name. Hello! How can I help you today?",
    '{"name": "get_weather", "arguments": {"city": "Paris"}} {"type": "object", "properties": {}}',
    "# Tools\n\nYou may call one or more functions to assist with the user query. function signatures XML tags",
    "Two plus two is four. 2 + 2 = 4. Once upon a time a long story about a fox who walks to the city.",
] * 20


def build_tokenizer(directory: Path):
    """Train the tiny byte-level BPE with Qwen3's markers and chat template; save it; return the HF tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()  # Qwen3's tokenizer.json normaliser (tokenization.md §2)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in MARKERS])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(directory)
    return hf


# the models the tests serve: `transformers serve`'s, and vLLM's (its CPU attention refuses head sizes below 32:
# ../shared/reference/vllm-cpu.md), trained on VLLM_CASES too
VARIANTS = {"serve": {"head_dim": 16, "cases": CASES}, "vllm": {"head_dim": 32, "cases": CASES + VLLM_CASES}}


def build(directory: Path, steps: int = 400, seed: int = 0, head_dim: int = 16, cases=None) -> Path:
    """Write tokenizer + chat template + a tiny Qwen3ForCausalLM trained on `cases` (default CASES) into
    `directory`; return it."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hf = build_tokenizer(directory)
    torch.manual_seed(seed)
    eos = hf.convert_tokens_to_ids("<|im_end|>")
    config = Qwen3Config(
        vocab_size=len(hf),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=1024,
        eos_token_id=eos,
        pad_token_id=hf.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model = Qwen3ForCausalLM(config)
    rows = []
    for messages, tools, target in CASES if cases is None else cases:
        prompt = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        p_ids = hf.encode(prompt, add_special_tokens=False)
        t_ids = hf.encode(target, add_special_tokens=False)
        rows.append((p_ids, t_ids))
    width = max(len(p) + len(t) for p, t in rows)
    inputs = torch.full((len(rows), width), hf.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, (p, t) in enumerate(rows):
        inputs[i, : len(p) + len(t)] = torch.tensor(p + t)
        labels[i, len(p) : len(p) + len(t)] = torch.tensor(t)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=inputs, labels=labels).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = hf.pad_token_id
    model.generation_config.do_sample = False
    model.save_pretrained(directory)
    (directory / "eaglewatch-build.json").write_text(
        json.dumps(
            {"steps": steps, "seed": seed, "head_dim": head_dim, "cases": len(rows), "final_loss": float(loss.detach())}
        )
    )
    return directory


def cache_root() -> Path:
    """Where the tests cache what is expensive to build: $EAGLEWATCH_TEST_CACHE, else ~/.cache/eaglewatch-tests."""
    base = os.environ.get("EAGLEWATCH_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "eaglewatch-tests"
    )
    return Path(base)


def built(variant: str = "serve") -> Path:
    """The tiny model folder of `variant` (VARIANTS: "serve" for `transformers serve`, "vllm" for vLLM), built once,
    keyed by this file's hash, and reused across runs. Racing builders each build into a folder of their own; the
    first rename wins."""
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    target = cache_root() / f"tiny-qwen3-{'' if variant == 'serve' else variant + '-'}{digest}"
    if not (target / "eaglewatch-build.json").exists():
        partial = target.with_name(target.name + f".part{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        build(partial, **VARIANTS[variant])
        if not (target / "eaglewatch-build.json").exists():
            shutil.rmtree(target, ignore_errors=True)  # a folder without the build record is no build
        try:
            partial.rename(target)
        except OSError:  # another process renamed its build there first
            shutil.rmtree(partial, ignore_errors=True)
    return target
