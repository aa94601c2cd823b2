"""Kimi K2.5 `tools_ts_str`: byte-for-byte what Moonshot's `encode_tools_to_typescript_style` gives.

The expected strings were produced by running the reference encoder (`tool_declaration_ts.py` from the
kimi-k2.5-hf-tokenizer, as vendored in thinking-machines-lab/tinker-cookbook
`tinker_cookbook/renderers/kimi_k2_5_tool_declaration_ts.py`) on the deep-key-sorted tools, as
`tokenization_kimi.apply_chat_template` does.
"""

from __future__ import annotations

import copy
import json

from app.tokens.prompt import encode_tools_typescript, render_prompt

WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a location.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "City and country, e.g. Paris, FR", "minLength": 1},
                    "unit": {
                        "type": "string",
                        "enum": ["celsius", "fahrenheit"],
                        "description": "Temperature unit",
                        "default": "celsius",
                    },
                    "days": {"type": "integer", "minimum": 1, "maximum": 14},
                    "include": {
                        "type": "array",
                        "items": {"type": "string", "enum": ["wind", "rain", "uv"]},
                        "description": "Extra fields",
                    },
                    "options": {
                        "type": "object",
                        "description": "Advanced options",
                        "properties": {
                            "lang": {"type": ["string", "null"]},
                            "units": {
                                "type": "object",
                                "properties": {"speed": {"type": "string", "enum": ["kmh", "mph"]}},
                                "required": ["speed"],
                            },
                            "hours": {
                                "type": "array",
                                "items": {"type": "integer", "description": "Hour of day", "minimum": 0, "maximum": 23},
                                "maxItems": 24,
                            },
                        },
                        "required": ["lang"],
                        "additionalProperties": False,
                    },
                },
                "required": ["location"],
            },
        },
    }
]

WEATHER_TS = (
    "# Tools\n\n## functions\nnamespace functions {\n"
    "// Get the current weather for a location.\n"
    "type get_weather = (_: {\n"
    "  // City and country, e.g. Paris, FR\n"
    "  // minLength: 1\n"
    "  location: string,\n"
    "  // maximum: 14, minimum: 1\n"
    "  days?: number,\n"
    "  // Extra fields\n"
    '  include?: Array<"wind" | "rain" | "uv">,\n'
    "  // Advanced options\n"
    "  options?: {\n"
    "    lang: string | null,\n"
    "    // maxItems: 24\n"
    "    hours?: Array<\n"
    "      // Hour of day\n"
    "      // maximum: 23, minimum: 0\n"
    "      number\n"
    "    >,\n"
    "    units?: {\n"
    '      speed: "kmh" | "mph"\n'
    "    },\n"
    "    [k: string]: never\n"
    "  },\n"
    "  // Temperature unit\n"
    '  // Default: "celsius"\n'
    '  unit?: "celsius" | "fahrenheit"\n'
    "}) => any;\n"
    "}\n"
)

SEARCH = [
    {
        "type": "function",
        "function": {
            "name": "search_web",
            "description": "Search the web.\n\nReturns the top results.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer", "default": 5},
                    "filters": {
                        "anyOf": [{"type": "string"}, {"type": "object", "properties": {"site": {"type": "string"}}}]
                    },
                    "meta": {"type": "object", "additionalProperties": {"type": "number"}},
                },
                "required": ["query"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
    {"type": "retrieval", "retrieval": {"name": "kb"}},
]

SEARCH_TS = (
    "# Tools\n\n## functions\nnamespace functions {\n"
    "// Search the web.\n"
    "\n"
    "// Returns the top results.\n"
    "type search_web = (_: {\n"
    "  query: string,\n"
    "  filters?: string | {\n"
    "    site?: string\n"
    "  },\n"
    "  // Default: 5\n"
    "  limit?: number,\n"
    "  meta?: {\n"
    "    [k: string]: number\n"
    "  }\n"
    "}) => any;\n"
    "type get_time = (_: {}) => any;\n"
    "}\n"
)

TREE = [
    {
        "type": "function",
        "function": {
            "name": "save_tree",
            "description": "Store a tree.",
            "parameters": {
                "type": "object",
                "$defs": {
                    "Node": {
                        "type": "object",
                        "description": "A tree node",
                        "properties": {
                            "value": {"type": "number"},
                            "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                        },
                        "required": ["value"],
                    }
                },
                "properties": {"root": {"$ref": "#/$defs/Node"}, "name": {"type": "string"}},
                "required": ["root"],
            },
        },
    }
]

TREE_TS = (
    "# Tools\n\n## functions\nnamespace functions {\n"
    "// A tree node\n"
    "interface Node {\n"
    "  value: number,\n"
    "  children?: Array<Node>\n"
    "}\n"
    "// Store a tree.\n"
    "type save_tree = (_: {\n"
    "  root: Node,\n"
    "  name?: string\n"
    "}) => any;\n"
    "}\n"
)


def _sorted(value):
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def test_nested_objects_enums_arrays_and_optional_params_match_the_reference():
    assert encode_tools_typescript(_sorted(WEATHER)) == WEATHER_TS


def test_anyof_additional_properties_and_parameterless_tools_match_the_reference():
    assert encode_tools_typescript(_sorted(SEARCH)) == SEARCH_TS


def test_defs_become_interfaces_before_the_function_type():
    assert encode_tools_typescript(_sorted(TREE)) == TREE_TS


def test_no_function_tools_gives_an_empty_declaration():
    assert encode_tools_typescript([]) == ""
    assert encode_tools_typescript([{"type": "retrieval", "retrieval": {}}]) == ""


def test_the_prompt_declares_the_tools_typescript_style_before_the_first_turn():
    prompt = render_prompt("kimi-k2.5", [{"role": "user", "content": "Weather?"}], WEATHER)
    assert prompt == (
        f"<|im_system|>tool_declare<|im_middle|>{WEATHER_TS}<|im_end|>"
        "<|im_user|>user<|im_middle|>Weather?<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    )


def test_the_declaration_does_not_depend_on_the_tools_key_order():
    shuffled = copy.deepcopy(WEATHER)
    params = shuffled[0]["function"]["parameters"]
    params["properties"] = dict(reversed(list(params["properties"].items())))
    shuffled[0]["function"] = dict(reversed(list(shuffled[0]["function"].items())))
    msgs = [{"role": "user", "content": "hi"}]
    assert render_prompt("kimi-k2.5", msgs, shuffled) == render_prompt("kimi-k2.5", msgs, WEATHER)


def test_a_schema_the_reference_rejects_falls_back_to_compact_json_of_the_sorted_tools():
    bad = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"n": {"type": "integer", "enum": ["one"]}}},
            },
        }
    ]
    prompt = render_prompt("kimi-k2.5", [{"role": "user", "content": "hi"}], bad)
    declared = prompt.split("<|im_middle|>", 1)[1].split("<|im_end|>", 1)[0]
    assert declared == json.dumps(_sorted(bad), separators=(",", ":"))
    assert declared.startswith('[{"function":{"name":"f","parameters":{"properties":')


def test_tools_without_any_function_are_declared_as_json():
    tools = [{"type": "retrieval", "retrieval": {"name": "kb"}}]
    prompt = render_prompt("kimi-k2.5", [{"role": "user", "content": "hi"}], tools)
    assert prompt.startswith(
        '<|im_system|>tool_declare<|im_middle|>[{"retrieval":{"name":"kb"},"type":"retrieval"}]<|im_end|>'
    )
