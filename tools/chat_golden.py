#!/usr/bin/env python3
"""Regenerates the chat-template golden files in tests/golden/chat/.

The reference is Python's jinja2 configured the way Hugging Face transformers
renders `tokenizer.chat_template`:

  * jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
    lstrip_blocks=True, extensions=[loopcontrols, <generation>])
  * filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=None,
    separators=None, sort_keys=False)   (HF's override)
  * globals["raise_exception"] raises TemplateError(message)
  * render(messages=[{"role":..., "content":...}], tools=None, documents=None,
           add_generation_prompt=..., bos_token=..., eos_token=...)

HF also defines `strftime_now` (today's date); Ember does not, so neither does
this reference (templates guard it with `is defined` and fall back to a fixed
date).

Usage (from the repo root; needs only `pip install jinja2`):

    python3 tools/chat_golden.py            # rewrite the .golden files
    python3 tools/chat_golden.py --check    # exit 1 if they are out of date

Outputs, all committed:
  tests/golden/chat/<name>.golden  for every tests/golden/chat/<name>.jinja,
                                   over the CONVERSATIONS below
  tests/golden/chat/subset.golden  for the SNIPPETS below (the Jinja subset)

File format (read by tests/unit/chat/test_chat_golden.cpp): '#' comment lines
at the top, then records made of a keyword line followed, for blobs, by
exactly N raw bytes and a newline:
    bos N\n<bytes>\n            eos N\n<bytes>\n
    case NAME GEN NMSG\n        then NMSG x (role N\n<bytes>\n content N\n<bytes>\n)
    tools_case NAME GEN NMSG\n  then tools N\n<JSON bytes>\n and the messages as for case
    snippet NAME\n template N\n<bytes>\n
    expect ok N\n<bytes>\n  |  expect error KIND N\n<message bytes>\n
KIND is `raise` for raise_exception (message must match exactly) or `error`
for any other failure (Ember must throw; the message is informative only).
"""
import argparse
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_DIR = os.path.join(ROOT, "tests", "golden", "chat")

TOKENS = {  # template file stem -> (bos_token, eos_token)
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3_1": ("<|begin_of_text|>", "<|eot_id|>"),
    "gemma2": ("<bos>", "<eos>"),
    "gemma3": ("<bos>", "<eos>"),
    "qwen2_5": ("", "<|im_end|>"),
    "deepseek_r1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
}
DEFAULT_TOKENS = ("<s>", "</s>")


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = [
    ("single_user", [m("user", "Hello!")]),
    ("system_user", [m("system", "You are a terse assistant."), m("user", "What is 2+2?")]),
    ("multi_turn", [m("system", "Be brief."), m("user", "Hi"), m("assistant", "Hello! How can I help?"),
                    m("user", "Tell me a joke.")]),
    ("multi_turn_no_system", [m("user", "Hi"), m("assistant", "Hello."), m("user", "Bye")]),
    ("assistant_last", [m("user", "Say yes."), m("assistant", "Yes.")]),
    ("empty_content", [m("user", ""), m("assistant", ""), m("user", "")]),
    ("unicode", [m("system", "Réponds en français. 日本語も OK."), m("user", "Grüße! 你好 👋🏽 café — ‘quotes’ ☃"),
                 m("assistant", "Ça va? ✅ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"), m("user", "مرحبا שלום Привет")]),
    ("template_like", [m("user", "{{ x }} {% if true %}y{% endif %} {# c #} {{- '-' -}}"),
                       m("assistant", "It's \"quoted\" and 'single' and \\ backslash"),
                       m("user", "<|im_end|><|eot_id|><end_of_turn> {{ raise_exception('no') }}")]),
    ("whitespace", [m("system", "  \n padded system \t"), m("user", "\u3000\xa0 nbsp and ideographic space \u2003\n"),
                    m("assistant", "\n\nleading newlines"), m("user", "trailing\r\n")]),
    ("newlines", [m("user", "line1\nline2\r\nline3\rline4\n\n\nend")]),
    ("tool_turn", [m("user", "Weather?"), m("assistant", "Calling a tool."),
                   m("tool", "{\"temp\": 21, \"unit\": \"C\", \"note\": \"<b>&'x'\"}"), m("user", "Thanks")]),
    ("reasoning", [m("user", "2+2?"), m("assistant", "<think>\nlet me think\n</think>\n\n4"), m("user", "and 3+3?")]),
    ("bad_alternation", [m("user", "one"), m("user", "two")]),
    ("empty", []),
    ("long", [m("user" if k % 2 == 0 else "assistant", f"turn {k} " + "word " * (k % 7)) for k in range(40)]),
]

# Tool calling (core/chat/tools.h): the same templates with `tools` set to an
# OpenAI tool list (as transformers passes a list of dicts), and messages with
# a tool call in the assistant's text and a role-"tool" result.
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather — in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "move_to", "description": "Walk the NPC to a place",
        "parameters": {"type": "object", "properties": {
            "x": {"type": "number", "minimum": -100.5}, "y": {"type": "integer"}, "run": {"type": "boolean"}},
            "required": ["x", "y"]}}},
]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOL_CONVERSATIONS = [
    ("tools_first_turn", [m("system", "You are a helpful assistant."), m("user", "Weather in Paris?")]),
    ("tools_no_system", [m("user", "Walk to 3, 4.")]),
    ("tools_round_trip", [m("user", "Weather in Paris?"), m("assistant", CALL), m("tool", '{"temp": 21.5}'),
                          m("user", "And tomorrow?")]),
    ("tools_result_last", [m("user", "Weather in Paris?"), m("assistant", CALL), m("tool", "sunny, 21 C")]),
]

# Small templates exercising the Jinja subset; rendered with
# messages=SNIPPET_MESSAGES, add_generation_prompt=True, bos/eos "<s>"/"</s>".
SNIPPET_MESSAGES = [m("system", "sys"), m("user", "Hello  "), m("assistant", " Hi! "), m("user", "Bye")]
SNIPPETS = [
    # whitespace control, trim_blocks, lstrip_blocks
    ("ws_trim_blocks", "{% if true %}\nA\n{% endif %}\nB\n"),
    ("ws_lstrip", "  {% if true %}\n  x\n  {% endif %}\n  y {# c #}\n  z"),
    ("ws_minus", "a  {%- if true %} b {% endif -%}  \n\n c"),
    ("ws_plus", "  {%+ if true %}\n{%- endif +%}\nq"),
    ("ws_var_minus", "a \n {{- 'b' -}} \n c {{ 'd' }} \n e"),
    ("ws_comment", "x\n  {# comment #}\ny\n{#- c -#}\n z"),
    ("ws_crlf_source", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n"),
    ("ws_trailing_newline", "x\n"),
    ("ws_unicode_lstrip", "a\n\u3000 {% if true %}b{% endif %}"),
    ("raw_block", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}|{%- raw -%}  x  {%- endraw -%}|"),
    ("ws_block_then_var", "{% for m in messages %}\n  {{ m.role }}\n{% endfor %}"),
    # literals and operators
    ("literals", "{{ 1 }} {{ -2 }} {{ 1.5 }} {{ 1e3 }} {{ 0x1F }} {{ 1_000 }} {{ true }} {{ none }} {{ 'a' 'b' }}"),
    ("string_escapes", r"""{{ 'tab\there' }}|{{ "q\"q" }}|{{ 'a\\b' }}|{{ '\x41\u00e9\U0001F600' }}|{{ '\d' }}|{{ '\101' }}"""),
    ("arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 1 / 4 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 3 * 'ab' }} {{ 1 + 2.5 }} {{ 10 - 3 * 2 }}"),
    ("float_repr", "{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1.5e-5 }} {{ 0.0001 }} {{ 2.0 }} {{ 1 / 3 }} {{ 100.0 * 3 }}"),
    ("concat", "{{ 'a' ~ 1 ~ none ~ true ~ undefined_thing ~ [1] }}"),
    ("compare", "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ [1,2] == [1,2] }} {{ (1,2) == [1,2] }} {{ none == none }} {{ 'x' != 'y' }}"),
    ("logic", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ not none }} {{ none or [] }} {{ 1 if false }}|{{ 'y' if 0 else 'n' }}"),
    ("in_ops", "{{ 'ell' in 'hello' }} {{ 2 in [1,2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'x' in undefined_thing }}"),
    ("containers", "{{ [1, 'a', none, true, 1.5] }} {{ (1,) }} {{ () }} {{ {'a': 1, 'b': [2]} }} {{ ['it\\'s', \"q\\\"\"] }} {{ [1,2,3][1:] }} {{ 'hello'[::-1] }} {{ [1,2,3][-1] }}"),
    ("subscript", "{{ messages[0]['role'] }} {{ messages[1].content }} {{ messages[-1]['content'] }} {{ messages[1:3] | length }} {{ 'abc'[1] }} {{ messages[9] is defined }}"),
    ("unicode_str", "{{ 'héllo wörld'[1:4] }} {{ 'héllo' | length }} {{ '日本語' | list }} {{ 'ÄÖÜ' | lower }} {{ 'straße' | upper }} {{ '👋🏽x'[2:] }}"),
    # statements
    ("for_loop_vars", "{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ x }};{% endfor %}"),
    ("for_else", "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|{% for x in undefined_thing %}{{ x }}{% else %}undef{% endfor %}"),
    ("for_filter", "{% for x in range(10) if x % 3 == 0 %}{{ x }}{{ '.' if not loop.last }}{% endfor %}"),
    ("for_unpack", "{% for k, v in {'a': 1, 'b': 2} | items %}{{ k }}={{ v }},{% endfor %}{% for a, b in [[1, 2], 'xy'] %}{{ a }}{{ b }}{% endfor %}"),
    ("for_dict_string", "{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}{% for c in 'añb' %}[{{ c }}]{% endfor %}"),
    ("for_prev_next_cycle", "{% for x in [1,2,3] %}{{ loop.previtem | default('-') }}{{ loop.nextitem | default('-') }}{{ loop.cycle('o','e') }} {% endfor %}"),
    ("nested_loops", "{% for a in [1,2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}"),
    ("loop_controls", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
    ("if_elif", "{% for x in [1,2,3,4] %}{% if x == 1 %}one{% elif x == 2 %}two{% elif x == 3 %}three{% else %}many{% endif %} {% endfor %}"),
    ("scope_for", "{% set x = 'outer' %}{% for i in [1,2] %}{{ x }}{% set x = 'inner' ~ i %}{{ x }} {% endfor %}{{ x }}"),
    ("scope_for_fresh", "{% for i in [1,2] %}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}[{{ y }}]"),
    ("scope_if", "{% if true %}{% set x = 1 %}{% endif %}{{ x }}"),
    ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% if m.role == 'assistant' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}"),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}"),
    ("set_block", "{% set body %}Hello {{ messages[1].content | trim }}{% endset %}[{{ body }}]{% set up | upper %}shout{% endset %}{{ up }}"),
    ("with_block", "{% with a = 1, b = 'x' %}{{ a }}{{ b }}{% endwith %}[{{ a }}]"),
    ("filter_block", "{% filter upper %}hello {{ 'world' }}{% endfilter %}"),
    ("macro", "{% macro greet(name, greeting='Hi') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', greeting='Yo') }} {{ greet(name='Cy') }}"),
    ("macro_varargs", "{% macro f(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ f(1, 2, 3, k='v') }}"),
    ("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1) | int }}{% endif %}{% endmacro %}{{ fact(5) }}"),
    ("print_stmt", "{% print 'a', 1 %}"),
    ("generation_block", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}{% endfor %}"),
    # filters
    ("filters_str", "{{ '  x  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'hELLo wOrld' | capitalize }}|{{ 'hello big-world (x)' | title }}|{{ 'a-b' | replace('-', '+') }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ 42 | string }}"),
    ("filters_seq", "{{ [3,1,2] | sort }}|{{ [3,1,2] | sort(reverse=true) }}|{{ ['b','A','c'] | sort }}|{{ [1,2,3] | first }}|{{ [1,2,3] | last }}|{{ [1,2] | join(', ') }}|{{ 'abc' | join('-') }}|{{ [1,1,2] | unique | list }}|{{ [1,2] | reverse | list }}|{{ [1,2,3] | sum }}|{{ [1,5,3] | max }}|{{ [4,2,8] | min }}"),
    ("filters_map_select", "{{ messages | map(attribute='role') | join(',') }}|{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}|{{ messages | rejectattr('role', 'eq', 'system') | list | length }}|{{ [1,2,3,4] | select('odd') | list }}|{{ [0,1,'',2] | select | list }}|{{ ['a','b'] | map('upper') | list }}|{{ [1,2,3] | reject('in', [2]) | list }}"),
    ("filters_default", "{{ undefined_thing | default('dflt') }}|{{ none | default('x') }}|{{ '' | default('empty', true) }}|{{ undefined_thing | d('d') }}|{{ undefined_thing | length }}|{{ messages | length }}|{{ 'héllo' | count }}"),
    ("filters_tojson", "{{ {'a': [1, 2.5, none, true], 'b': 'x\"y\\n\u00e9<>&'} | tojson }}|{{ [1, {'k': 'v'}] | tojson(indent=2) }}|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}|{{ 'plain' | tojson }}|{{ [] | tojson(indent=2) }}|{{ {} | tojson }}"),
    ("filters_numbers", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 'x' | float }} {{ -3 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 2.1 | round(method='ceil') }}"),
    ("filters_dict", "{{ {'b': 2, 'a': 1} | dictsort }}|{{ {'b': 2, 'a': 1} | items | list }}|{{ {'x': 1}.get('x') }}{{ {'x': 1}.get('y', 'no') }}|{{ {'x': 1}.keys() | list }}|{{ {'x': 1}.values() | list }}"),
    ("filters_indent", "{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, first=true) }}|{{ 'a\n\nb' | indent('> ', blank=true) }}"),
    ("filters_misc", "{{ [1,2,3,4,5] | batch(2) | list }}|{{ 'x' | center(5) }}|{{ messages[0] | attr('role') }}|{{ {'a': {'b': 'deep'}} | map(attribute='a') | list }}"),
    # methods
    ("str_methods", "{{ '  a b  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'Hello'.startswith('He') }}|{{ 'Hello'.endswith(('x', 'lo')) }}|{{ 'abc'.upper() }}|{{ 'ABC'.lower() }}|{{ 'hello world'.title() }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'hello'.find('l') }}|{{ 'a\nb\r\nc'.splitlines() }}|{{ '-'.join(['a', 'b']) }}|{{ 'abc'.count('b') }}|{{ '123'.isdigit() }}"),
    ("method_via_getitem", "{{ messages[0]['role'].upper() }}|{{ (messages | first).content.strip() }}"),
    # tests
    ("tests", "{{ x is defined }} {{ messages is defined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ [] is sequence }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 1 is eq 1 }} {{ 2 is gt 1 }} {{ 1 is in [1] }} {{ x is not defined }} {{ 'upper' is filter }} {{ 'odd' is test }}"),
    ("test_message_fields", "{% for m in messages %}{{ m.tool_calls is defined }}{{ 'tool_calls' in m }}{{ m.content is string }}{% endfor %}"),
    ("globals", "{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }} {{ dict(a=1) }} {{ namespace(a=1).a }} {{ add_generation_prompt }} {{ bos_token }}{{ eos_token }} {{ tools }} {{ documents }}"),
    ("undefined_print", "[{{ nothing }}][{{ messages[0].nothing }}][{{ messages[42] }}]"),
    # edge semantics
    ("prec_unary_pow", "{{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ not 1 == 2 }} {{ not 'a' in 'abc' }} {{ -1 | abs }} {{ 'a' ~ 'b' + 'c' }} {{ 10 // 3 * 3 }} {{ messages | length > 2 }} {{ 1 if true else 2 if false else 3 }}"),
    ("repr_values", "{{ {1: 'a', 2.5: none, true: [1]} }} {{ ('a', \"it's\") }} {{ messages[0] }} {{ messages[0].items() | list }} {{ namespace(a=1, b='x') }} {{ [['x']] }} {{ 'a\\tb' | list }}"),
    ("repr_escapes", "{{ ['\\n', '\\\\', '\\x01', '\\x7f', 'é', '日本', '\\u00a0', '\\u200b', '👋', \"'\", '\"', '\\'\"'] }}"),
    ("float_more", "{{ 1e100 }} {{ 1.0e-10 }} {{ 123456789.123 }} {{ 0.5 | round }} {{ 1.5 | round }} {{ -0.0 }} {{ 1e22 }} {{ 5e-324 }} {{ 0.1 * 3 }} {{ 2.5 // 1 }} {{ -7.5 % 2 }} {{ 7 / 7 }}"),
    ("int_float_filters", "{{ ' 12 ' | int }} {{ '0x1A' | int(base=16) }} {{ '1_000' | int }} {{ '1e3' | int }} {{ 'inf' | float }} {{ '-3.25' | float }} {{ true | int }} {{ none | int }} {{ '12abc' | int }} {{ 3 | float }}"),
    ("dict_methods_more", "{{ messages[0]['items'] is defined }} {{ 'x'.foo is defined }} {{ messages[0].get('role') }} {{ messages[0].get('nope') }} {{ messages[0].keys() | list }}"),
    ("split_more", "{{ '  a  b  '.split(' ') }} {{ 'a\\tb  c\\n'.split(none, 1) }} {{ ''.split() }} {{ ''.split(',') }} {{ 'Hello World'.swapcase() }} {{ \"they're bill's\".title() }} {{ \"they're bill's\" | title }} {{ 'a,b'.rsplit(',') }}"),
    ("strip_unicode", "{{ '\\u3000x\\xa0' | trim | length }} {{ '\\u200bx\\u200b' | trim | length }} {{ '\\x1cx\\x85' | trim }} {{ '--x--'.strip('-') }} {{ 'abcxcba'.strip('abc') }}"),
    ("sort_more", "{{ ['b', 'A', 'a', 'B'] | sort }} {{ ['b', 'A', 'a', 'B'] | sort(case_sensitive=true) }} {{ ['a', 'A', 'b'] | unique | list }} {{ {'a': 2, 'b': 1} | dictsort(by='value') }} {{ [{'n': 2}, {'n': 1}] | sort(attribute='n') | map(attribute='n') | list }} {{ [3, 1] | sort | first }} {{ [[2, 'b'], [1, 'z'], [2, 'a']] | sort }}"),
    ("select_more", "{{ messages | selectattr('role', 'in', ['user', 'assistant']) | list | length }} {{ messages | map(attribute='nothing', default='d') | list }} {{ [1,2,3] | select('gt', 1) | list }} {{ [1,2,3] | reject('eq', 2) | list }} {{ messages | selectattr('content') | list | length }}"),
    ("tests_more", "{{ 'abc' is sequence }} {{ none is iterable }} {{ nothing is iterable }} {{ nothing is sequence }} {{ 'A' is upper }} {{ '1' is lower }} {{ true is number }} {{ true is integer }} {{ none is sameas none }} {{ true is sameas true }} {{ 3 is divisibleby(2) }} {{ nothing is undefined }} {{ 1.5 is number }}"),
    ("seq_filters_more", "{{ (1, 2) | list }} {{ 'abc' | list }} {{ [] | first }}|{{ [] | max }}|{{ [1.5, 2] | sum }} {{ messages | map(attribute='role') | unique | list }} {{ [1, 2, 3] | map('string') | join }} {{ {'a': 1, 'b': 2} | join(',') }} {{ 'abc' | reverse }} {{ {'a': 1} | list }} {{ x | default }}|{{ [1, 2, 3] | last }}"),
    ("slices_more", "{% set a = [1,2,3] %}{{ a[1:] }}{{ a[:-1] }}{{ a[::2] }}{{ a[5:] }}{{ a[-10:2] }}{{ 'abcdef'[1:5:2] }}{{ a[::-1] }}{{ 'abc'[-1:] }}{{ a[none:2] }}"),
    ("tojson_more", "{{ messages[1].content | tojson }} {{ '\\u00e9\\u2028\\x1f' | tojson }} {{ {'a': 1, 'b': {'c': [1, {}]}} | tojson(indent=2, sort_keys=true) }} {{ [1, [2, [3]]] | tojson(indent=1) }} {{ {'k': 1.0, 'n': none} | tojson(separators=(',', ':')) }} {{ 1e16 | tojson }} {{ (1, 'a') | tojson }}"),
    ("macro_more", "{% macro f(a, b=a ~ '!') %}{{ b }}{% endmacro %}{{ f('x') }}{% macro g() %}{{ messages | length }}{% endmacro %}{{ g() }}{% macro h(x) %}[{{ x }}]{% endmacro %}{{ h() }}{{ h(x=2) }}"),
    ("loop_filtered_length", "{% for x in messages if x.role != 'system' %}{{ loop.index }}/{{ loop.length }}{{ loop.cycle('a', 'b', 'c') }} {% endfor %}{{ loop }}|"),
    ("ns_self_repr", "{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns }} {{ [ns, ns] }} {% set other = namespace(peer=ns) %}{% set ns.o = other %}{{ other }} {{ ns == ns.me }} {{ ns.me.me.a }}"),
    ("ns_nested_chain", "{% set ns = namespace(x=0) %}{% for i in range(30) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }} {{ ns.x == ns.x }} {% set ns.d = {} %}{% for i in range(30) %}{% set ns.d = {'k': ns.d} %}{% endfor %}{{ ns.d | tojson }}"),
    ("set_in_loop_leak", "{% for m in messages %}{% set last_role = m.role %}{% endfor %}[{{ last_role }}]{% set ns = namespace(r='') %}{% for m in messages %}{% set ns.r = m.role %}{% endfor %}[{{ ns.r }}]"),
    ("ws_edge_1", "{{ 'a' -}}\n  {% if true %}b{% endif %}\n\t{% if true %}c{% endif %}\n  {#- c #}\nx"),
    ("ws_edge_2", "{%- if true -%}\n  a  \n{%- endif -%}\n|  {%+ if true %}k{% endif +%}   \n|{% if true %}  \n{% endif %}|"),
    ("ws_edge_3", "line\n    {% for i in [1, 2] %}\n    item {{ i }}\n    {% endfor %}\nend\n\n"),
    ("ws_edge_4", "{% if true %}\r\n  x\r\n{% endif %}\r\n{{ 'a\r\nb' | length }}"),
    ("string_literal_edge", "{{ '{{' }}{{ '}}' }}{{ \"{% raw %}\" }}{{ 'multi\nline' }}{{ 'tab\\\\there' }}{{ '\\é' }}{{ 'a' \"b\" 'c' }}"),
    ("nested_access", "{{ {'a': {'b': 1}}['a']['b'] }} {{ {'a': [10, 20]}.a[1] }} {{ messages.0.role }} {{ [[1, 2]][0][1] }} {{ {'x': 'y'}['x'] | upper }}"),
    ("undefined_ops", "[{{ nothing ~ 'x' }}][{{ nothing == nothing }}][{{ nothing != 1 }}][{{ nothing | string }}][{{ nothing | upper }}][{{ nothing | list }}][{{ nothing | join(',') }}][{{ nothing is none }}][{{ not nothing }}][{{ nothing or 'or' }}]"),
    ("err_undefined_chain", "{{ messages[0].role.nothing.more }}"),
    ("err_unpack", "{% for a, b in [1] %}{% endfor %}"),
    ("err_ns_assign", "{% set ns = 1 %}{% set ns.x = 1 %}"),
    ("err_slice_step", "{{ [1, 2][0:1:0] }}"),
    ("err_sum_strings", "{{ ['a', 'b'] | sum(start='') }}"),
    ("err_int_plus_str", "{{ 1 ~ 2 + 3 }}"),
    ("err_iter_int", "{% for x in 42 %}{% endfor %}"),
    ("err_tojson_undefined", "{{ nothing | tojson }}"),
    ("err_items_non_mapping", "{{ [1] | items | list }}"),
    # errors
    ("err_raise", "{{ raise_exception('Custom failure: ' ~ messages | length) }}"),
    ("err_undefined_attr", "{{ nothing.attr }}"),
    ("err_undefined_add", "{{ nothing + 1 }}"),
    ("err_type_add", "{{ 'a' + 1 }}"),
    ("err_div_zero", "{{ 1 // 0 }}"),
    ("err_not_callable", "{{ 'x'() }}"),
    ("err_unsafe_append", "{{ [].append(1) }}"),
    ("err_cmp_types", "{{ 1 < 'a' }}"),
    ("err_syntax_unclosed", "{% if true %}no end"),
    ("err_syntax_unknown_tag", "{% frobnicate %}"),
    ("err_syntax_bad_expr", "{{ 1 + }}"),
    ("err_syntax_unterminated_var", "{{ x "),
    ("err_syntax_unterminated_comment", "{# never closed"),
    ("err_syntax_unterminated_string", "{{ 'abc }}"),
    ("err_unknown_filter", "{{ 1 | no_such_filter }}"),
    ("err_big_range", "{{ range(1000000) | length }}"),
]


def make_env():
    class GenerationExtension(Extension):  # HF's AssistantTracker, minus index tracking
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(lineno)

        def _generation(self, caller):
            return caller()

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationExtension, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def render(env, source, messages, gen, bos, eos, tools=None):
    """Returns ('ok', text) or ('raise'|'error', message)."""
    try:
        tpl = env.from_string(source)
        return "ok", tpl.render(messages=messages, tools=tools, documents=None, add_generation_prompt=gen,
                                bos_token=bos, eos_token=eos)
    except TemplateError as e:
        if type(e) is TemplateError:  # raise_exception
            return "raise", str(e)
        return "error", f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - any Python error is an expected failure
        return "error", f"{type(e).__name__}: {e}"


def blob(keyword, data):
    b = data.encode("utf-8")
    return f"{keyword} {len(b)}\n".encode() + b + b"\n"


def expect(result):
    kind, text = result
    if kind == "ok":
        return blob("expect ok", text)
    return blob(f"expect error {kind}", text)


HEADER = (
    "# Generated by tools/chat_golden.py from Python jinja2 {ver} with Hugging Face's settings\n"
    "# (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, HF tojson,\n"
    "# raise_exception). Do not edit: remake with `python3 tools/chat_golden.py`.\n"
    "# Format: see the docstring of tools/chat_golden.py.\n"
)


def build_template_golden(env, name, source):
    bos, eos = TOKENS.get(name, DEFAULT_TOKENS)
    out = bytearray(HEADER.format(ver=jinja2.__version__).encode())
    out += f"# template: {name}.jinja\n".encode()
    out += blob("bos", bos) + blob("eos", eos)
    for conv_name, msgs in CONVERSATIONS:
        for gen in (True, False):
            out += f"case {conv_name} {int(gen)} {len(msgs)}\n".encode()
            for msg in msgs:
                out += blob("role", msg["role"]) + blob("content", msg["content"])
            out += expect(render(env, source, msgs, gen, bos, eos))
    tools_json = json.dumps(TOOLS, ensure_ascii=False)
    for conv_name, msgs in TOOL_CONVERSATIONS:
        for gen in (True, False):
            out += f"tools_case {conv_name} {int(gen)} {len(msgs)}\n".encode()
            out += blob("tools", tools_json)
            for msg in msgs:
                out += blob("role", msg["role"]) + blob("content", msg["content"])
            out += expect(render(env, source, msgs, gen, bos, eos, tools=json.loads(tools_json)))
    return bytes(out)


def build_subset_golden(env):
    bos, eos = DEFAULT_TOKENS
    out = bytearray(HEADER.format(ver=jinja2.__version__).encode())
    out += b"# snippets: messages = SNIPPET_MESSAGES, add_generation_prompt = True\n"
    out += blob("bos", bos) + blob("eos", eos)
    out += f"case messages 1 {len(SNIPPET_MESSAGES)}\n".encode()
    for msg in SNIPPET_MESSAGES:
        out += blob("role", msg["role"]) + blob("content", msg["content"])
    for name, source in SNIPPETS:
        out += f"snippet {name}\n".encode()
        out += blob("template", source)
        out += expect(render(env, source, SNIPPET_MESSAGES, True, bos, eos))
    return bytes(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if a golden file is out of date")
    args = ap.parse_args()
    env = make_env()
    outputs = {}
    for fname in sorted(os.listdir(GOLDEN_DIR)):
        if fname.endswith(".jinja"):
            name = fname[: -len(".jinja")]
            with open(os.path.join(GOLDEN_DIR, fname), "rb") as f:
                source = f.read().decode("utf-8")
            outputs[name + ".golden"] = build_template_golden(env, name, source)
    outputs["subset.golden"] = build_subset_golden(env)
    stale = []
    for fname, data in outputs.items():
        path = os.path.join(GOLDEN_DIR, fname)
        old = open(path, "rb").read() if os.path.exists(path) else None
        if old != data:
            stale.append(fname)
            if not args.check:
                with open(path, "wb") as f:
                    f.write(data)
    if args.check and stale:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    print(("checked " if args.check else "wrote ") + ", ".join(sorted(outputs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
