#!/usr/bin/env python3
"""Build the small Kimi-style byte-level BPE tokenizer in `sample_data/tokenizer/`.

Deterministic: the training corpus is generated here from a seeded RNG (English prose, code, JSON, CJK,
emoji, tool-call ids), nothing is downloaded, and running the script twice writes byte-identical files
(`tests/fixtures_data` checks that the committed files are reproduced).

The layout mirrors Kimi K2.5 where it matters to eaglewatch:
- the same pre-tokeniser pattern as Kimi's tiktoken `pat_str` (Han runs on their own, digits in 1-3);
- no normaliser, no BOS/EOS added by `encode`;
- the special and added tokens after the base vocabulary in Kimi's id order, with Kimi's `special`
  flags: the chat markers are special; the tool-call markers, `<think>` and `</think>` are added tokens
  that are *not* special (as in the K2.5 `tokenizer_config.json`);
- a K2.5-style chat template (tool_declare block, `<think>` forced open by the generation prompt).

Usage: python scripts/build_sample_tokenizer.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: the same merges on every machine

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "sample_data" / "tokenizer"

SEED = 20260101
VOCAB_SIZE = 6144  # base vocabulary (256 bytes + merges); the added tokens come after it

# Kimi's tiktoken pre-tokeniser pattern (see ../shared/tokenizers/kimi-k2.5/README.md), alternatives in order.
KIMI_PATTERN = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

# (content, special) in Kimi K2.5 id order; ids are VOCAB_SIZE + index.
ADDED_TOKENS: list[tuple[str, bool]] = [
    ("[BOS]", True),
    ("[EOS]", True),
    ("<|im_end|>", True),
    ("<|im_user|>", True),
    ("<|im_assistant|>", True),
    ("<|im_system|>", True),
    ("<|tool_calls_section_begin|>", False),
    ("<|tool_calls_section_end|>", False),
    ("<|tool_call_begin|>", False),
    ("<|tool_call_argument_begin|>", False),
    ("<|tool_call_end|>", False),
    ("<|im_middle|>", True),
    ("<think>", False),
    ("</think>", False),
    ("[UNK]", True),
    ("[PAD]", True),
]

# A K2.5-style chat template. Differences from the real one are deliberate simplifications: tools are
# declared as compact JSON (K2.5 renders TypeScript via remote code); there is no default system prompt.
# `preserve_thinking=true` keeps every assistant turn's reasoning, which is what a training sample's
# full conversation needs to equal prompt + output ids.
CHAT_TEMPLATE = """\
{%- macro render_content(msg) -%}
{%- set c = msg.get('content') -%}
{%- if c is string -%}{{ c }}
{%- elif c is not none -%}{%- for part in c -%}{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- macro render_role(message) -%}
{%- set role_name = message.get('name') or message['role'] -%}
{%- if message['role'] == 'user' -%}<|im_user|>{{ role_name }}<|im_middle|>
{%- elif message['role'] == 'assistant' -%}<|im_assistant|>{{ role_name }}<|im_middle|>
{%- else -%}<|im_system|>{{ role_name }}<|im_middle|>
{%- endif -%}
{%- endmacro -%}
{%- macro render_tool_calls(message) -%}
<|tool_calls_section_begin|>
{%- for tool_call in message['tool_calls'] -%}
<|tool_call_begin|>{{ tool_call['id'] }}<|tool_call_argument_begin|>
{%- if tool_call['function']['arguments'] is string -%}{{ tool_call['function']['arguments'] }}
{%- else -%}{{ tool_call['function']['arguments'] | tojson(separators=(',', ':')) }}
{%- endif -%}<|tool_call_end|>
{%- endfor -%}
<|tool_calls_section_end|>
{%- endmacro -%}
{%- set preserve_thinking = preserve_thinking | default(false) -%}
{%- set ns = namespace(last_plain_assistant=-1) -%}
{%- if not preserve_thinking -%}
{%- for idx in range(messages | length - 1, -1, -1) -%}
{%- if ns.last_plain_assistant == -1 and messages[idx]['role'] == 'assistant' and not messages[idx].get('tool_calls') -%}
{%- set ns.last_plain_assistant = idx -%}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}<|im_end|>
{%- endif -%}
{%- for message in messages -%}
{{ render_role(message) }}
{%- if message['role'] == 'assistant' -%}
{%- if loop.index0 <= ns.last_plain_assistant or (thinking is defined and thinking is false and not preserve_thinking) -%}
<think></think>
{%- else -%}
<think>{{ message.get('reasoning_content') or message.get('reasoning') or '' }}</think>
{%- endif -%}
{{ render_content(message) }}
{%- if message.get('tool_calls') -%}{{ render_tool_calls(message) }}{%- endif -%}
{%- elif message['role'] == 'tool' -%}
## Return of {{ message.get('tool_call_id') }}
{{ render_content(message) }}
{%- else -%}{{ render_content(message) }}
{%- endif -%}
<|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>
{%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}
{%- endif -%}"""


# ---------------------------------------------------------------------------------------------------
# Corpus: small seeded generators, also used by build_sample_reference.py for sample texts.

WORDS = """
the of and to in is that for it as with was on be by this are from at or an have not which but all
they can more has one their there will would about when what so out up into its also only other time
some could them these then than two may first new like use each data model token tokens training draft
target layer hidden state states sample samples output input prompt response server request batch run
speculative decoding accept length verify reasoning answer question think because therefore however
example result value function call tool weather city temperature search query file path line error
check compare encode decode text string byte bytes merge vocabulary rank table special marker turn user
assistant system message content field number list order first second third last next previous before
after during while until since each every many much few small large fast slow good better best simple
clear exact close careful step steps plan write read open close start stop stream chunk piece part whole
people world year years day days work works made make makes way ways long short high low right left
problem problems solution solutions idea ideas reason reasons case cases point points fact facts number
numbers water river mountain forest ocean light sound music color green blue red yellow black white
house school city country road train station market garden kitchen window door table chair paper book
story history science math physics chemistry biology language computer program memory network disk
I'll I'm don't can't it's we're you're they've that's let's isn't doesn't won't
""".split()

CAPITALISED = "The This We It In For When If After Before However Therefore First Next Finally Let Now So".split()

CJK_CHARS = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经"
    "十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严"
    "こんにちはありがとうございますわたしはがくせいですカタカナテストひらがな"
)
EMOJI = "😀😂🥹😍🤔😎🙏👍🎉🔥✨🚀💡📈🌍🍜☕️❤️✅❌⚠️🧪🤖🐍🦀"

PY_NAMES = (
    "load_config parse_line encode_batch decode_ids merge_ranks token_bytes apply_template split_output run_job "
    "shard_path".split()
)
JS_NAMES = "fetchData renderRow parseJson handleClick updateState computeScore formatDate".split()


SYLLABLES = (
    "ba be bi bo bu ca co da de di do fa fe fi ga go ha he hi ho ka ke ki ko la le li lo lu ma me mi mo mu na ne ni "
    "no nu pa pe pi po ra re ri ro ru sa se si so ta te ti to tu va ve vi wa we ya yo za ze str tion ment ing er est "
    "ly ous ive al ism ize".split()
)
_lexicon_rng = random.Random(7)
# Rarer "words" (pseudo-English, from syllables) give the BPE enough variety to fill its vocabulary.
RARE_WORDS = sorted(
    {"".join(_lexicon_rng.choice(SYLLABLES) for _ in range(_lexicon_rng.randint(2, 4))) for _ in range(3000)}
)


def word(rng: random.Random) -> str:
    """A common word most of the time, a rarer one sometimes."""
    return rng.choice(RARE_WORDS) if rng.random() < 0.2 else rng.choice(WORDS)


def sentence(rng: random.Random, n_min: int = 6, n_max: int = 18) -> str:
    """One English-like sentence from the word list."""
    words = [word(rng) for _ in range(rng.randint(n_min, n_max))]
    if rng.random() < 0.4:
        words.insert(rng.randrange(len(words)), str(rng.choice([rng.randint(0, 99), rng.randint(100, 99999)])))
    first = rng.choice(CAPITALISED) if rng.random() < 0.5 else words.pop(0).capitalize()
    if len(words) > 2 and rng.random() < 0.25:
        k = rng.randrange(1, len(words) - 1)
        words[k] += ","
    body = " ".join([first, *words])
    return body + rng.choice([".", ".", ".", "?", "!", ":"])


def prose(rng: random.Random, sentences: int) -> str:
    """Paragraphs of sentences, with the occasional markdown list."""
    parts: list[str] = []
    for _i in range(sentences):
        s = sentence(rng)
        if rng.random() < 0.08:
            s = "\n\n" + s
        elif rng.random() < 0.06:
            s = "\n- " + s
        elif rng.random() < 0.04:
            s = f"\n{rng.randint(1, 9)}. " + s
        parts.append(s)
    return " ".join(parts).replace(" \n", "\n").strip()


def cjk_text(rng: random.Random, n: int) -> str:
    """Chinese/Japanese text with CJK punctuation."""
    out: list[str] = []
    while len(out) < n:
        out.extend(rng.choice(CJK_CHARS) for _ in range(rng.randint(3, 12)))
        out.append(rng.choice("，。、！？"))
    return "".join(out)


def emoji_text(rng: random.Random) -> str:
    """A short sentence with emoji in it."""
    words = sentence(rng, 3, 8).split()
    for _ in range(rng.randint(1, 3)):
        words.insert(rng.randrange(len(words) + 1), rng.choice(list(EMOJI)))
    return " ".join(words)


def python_code(rng: random.Random) -> str:
    """A small Python function."""
    name = rng.choice(PY_NAMES)
    arg = rng.choice(["path", "ids", "text", "config", "batch"])
    n = rng.randint(1, 64)
    return (
        f"def {name}({arg}: list[int], limit: int = {n}) -> dict:\n"
        f'    """{sentence(rng, 4, 9)}"""\n'
        f"    result = {{}}\n"
        f"    for i, item in enumerate({arg}):\n"
        f"        if i >= limit:\n"
        f"            break\n"
        f"        result[str(item)] = item * {rng.randint(2, 9)}\n"
        f"    return result\n"
    )


def js_code(rng: random.Random) -> str:
    """A small JavaScript function."""
    name = rng.choice(JS_NAMES)
    return (
        f"async function {name}(id) {{\n"
        f"  const res = await fetch(`/api/items/${{id}}?limit={rng.randint(1, 100)}`);\n"
        f"  if (!res.ok) throw new Error('request failed: ' + res.status);\n"
        f"  return (await res.json()).items.map((x) => x.value * {rng.randint(2, 9)});\n"
        f"}}\n"
    )


def json_value(rng: random.Random, depth: int = 0) -> object:
    """A random JSON-able value."""
    kind = rng.random()
    if depth < 2 and kind < 0.3:
        return {rng.choice(WORDS): json_value(rng, depth + 1) for _ in range(rng.randint(1, 4))}
    if depth < 2 and kind < 0.4:
        return [json_value(rng, depth + 1) for _ in range(rng.randint(1, 3))]
    if kind < 0.6:
        return rng.choice(WORDS)
    if kind < 0.75:
        return rng.randint(-5, 5000)
    if kind < 0.85:
        return round(rng.uniform(-100, 100), 2)
    return rng.choice([True, False, None])


def json_text(rng: random.Random) -> str:
    """A JSON object, compact or indented."""
    obj = {rng.choice(WORDS): json_value(rng) for _ in range(rng.randint(1, 5))}
    style = rng.random()
    if style < 0.5:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    if style < 0.8:
        return json.dumps(obj, ensure_ascii=False)
    return json.dumps(obj, indent=2, ensure_ascii=False)


def tool_id_text(rng: random.Random) -> str:
    """A Kimi tool-call id such as `functions.get_weather:0`."""
    name = rng.choice(["get_weather", "search", "read_file", "run_python", "lookup_price", "send_email"])
    return f"functions.{name}:{rng.randint(0, 12)}"


def corpus(seed: int = SEED, documents: int = 8000) -> list[str]:
    """The training corpus: a fixed mix of prose, code, JSON, CJK, emoji and tool ids."""
    rng = random.Random(seed)
    docs: list[str] = []
    for _ in range(documents):
        r = rng.random()
        if r < 0.45:
            docs.append(prose(rng, rng.randint(2, 10)))
        elif r < 0.58:
            docs.append(python_code(rng))
        elif r < 0.64:
            docs.append(js_code(rng))
        elif r < 0.76:
            docs.append(json_text(rng))
        elif r < 0.88:
            docs.append(cjk_text(rng, rng.randint(10, 80)))
        elif r < 0.95:
            docs.append(emoji_text(rng))
        else:
            docs.append(" ".join(tool_id_text(rng) for _ in range(rng.randint(1, 4))))
    return docs


# ---------------------------------------------------------------------------------------------------


def build_tokenizer():
    """Train the BPE and attach the Kimi-style added tokens; returns a `tokenizers.Tokenizer`."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(KIMI_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    base = tok.get_vocab_size(with_added_tokens=False)
    if base != VOCAB_SIZE:
        raise SystemExit(f"trained vocabulary has {base} tokens, expected {VOCAB_SIZE}: grow the corpus")
    for content, special in ADDED_TOKENS:
        added = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False)
        n = tok.add_special_tokens([added]) if special else tok.add_tokens([added])
        if n != 1:
            raise SystemExit(f"could not add {content!r}")
    for i, (content, _) in enumerate(ADDED_TOKENS):
        if tok.token_to_id(content) != VOCAB_SIZE + i:
            raise SystemExit(f"{content!r} got id {tok.token_to_id(content)}, expected {VOCAB_SIZE + i}")
    return tok


def tokenizer_config() -> dict:
    """The `tokenizer_config.json` contents (fast tokenizer class, Kimi's special roles, chat template)."""
    decoder = {
        str(VOCAB_SIZE + i): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (content, special) in enumerate(ADDED_TOKENS)
    }
    return {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [
            "<|im_end|>",
            "<|im_user|>",
            "<|im_assistant|>",
            "<|im_system|>",
            "<|im_middle|>",
        ],
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "unk_token": "[UNK]",
        "pad_token": "[PAD]",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 262144,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }


def special_tokens_map() -> dict:
    """The `special_tokens_map.json` contents."""
    return {
        "additional_special_tokens": [
            "<|im_end|>",
            "<|im_user|>",
            "<|im_assistant|>",
            "<|im_system|>",
            "<|im_middle|>",
        ],
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "unk_token": "[UNK]",
        "pad_token": "[PAD]",
    }


def _dump(obj: dict) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n"


def write_files(out: Path, files: dict[str, str]) -> list[Path]:
    """Write each named text into `out` (UTF-8); return the paths in order. The other sample-data builders
    write their files through it too."""
    paths = []
    for name, text in files.items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def build(out: Path) -> list[Path]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into `out`; return their paths."""
    tok = build_tokenizer()
    out.mkdir(parents=True, exist_ok=True)
    # Re-serialise through json so the file is stable and diff-friendly (sorted by the library, indented here).
    files = {
        "tokenizer.json": _dump(json.loads(tok.to_str())),
        "tokenizer_config.json": _dump(tokenizer_config()),
        "special_tokens_map.json": _dump(special_tokens_map()),
    }
    return write_files(out, files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    for path in build(args.out):
        print(f"wrote {path} ({path.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
