#!/usr/bin/env python3
"""Generates ../expected.json: chat templates rendered by Jinja2 exactly as
transformers' apply_chat_template renders them (same environment, filters
and globals as transformers.utils.chat_template_utils._compile_jinja_template).

Run from this directory: python3 gen.py  (needs jinja2 >= 3.1).
check_lenml.js cross-checks the Llama-3.1 cases against @lenml/tokenizers.
"""
import json
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = datetime(2025, 1, 2, 15, 4, 5)  # the Go test sets Template.Now to this


def compile_template(src):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(src)


def render(src, messages, add_generation_prompt, variables):
    kwargs = {"tools": None, "documents": None}
    kwargs.update(variables)
    return compile_template(src).render(messages=messages, add_generation_prompt=add_generation_prompt, **kwargs)


def config(path):
    with open(path) as f:
        cfg = json.load(f)
    special = {k: cfg[k] for k in ("bos_token", "eos_token") if isinstance(cfg.get(k), str)}
    return cfg["chat_template"], special


SYS_USER = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 2+2?"}]
USER = [{"role": "user", "content": "  Hello there!\n"}]
MULTI = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Tell me a joke about \"quotes\" and 'apostrophes'."},
]
THINK = [
    {"role": "user", "content": "What is 3*4?"},
    {"role": "assistant", "content": "<think>\nmultiply\n</think>\n\n12"},
    {"role": "user", "content": "And 5*6? Ünïcödé ✓ 你好"},
]
THINK_LAST = THINK + [{"role": "assistant", "content": "<think>\n\nquick\n\n</think>\n\n30"}]
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}}]},
    {"role": "tool", "content": "{\"temp\": 21}"},
]
ONLY_MESSAGES = None  # marks a case whose messages go to the template as vars["messages"]


def cases():
    llama31, llama31_special = config("../llama3_1_tokenizer_config.json")
    qwen3, qwen3_special = config("../qwen3_tokenizer_config.json")
    with open("../llama3_2.jinja") as f:
        llama32 = f.read()
    llama32_special = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    out = []

    def add(name, template, src, messages, gen, special, extra=None, raw_messages=False):
        variables = dict(special)
        variables.update(extra or {})
        if raw_messages:
            variables["messages"] = messages
        out.append({
            "name": name,
            "template": template,
            "messages": [] if raw_messages else messages,
            "add_generation_prompt": gen,
            "vars": variables,
            "expected": render(src, messages, gen, {k: v for k, v in variables.items() if k != "messages"}),
        })

    for tname, src, special in (("llama3_1", llama31, llama31_special), ("qwen3", qwen3, qwen3_special)):
        add(tname + "/system_user_gen", tname, src, SYS_USER, True, special)
        add(tname + "/user_nogen", tname, src, USER, False, special)
        add(tname + "/multi_turn_gen", tname, src, MULTI, True, special)
        add(tname + "/multi_turn_nogen", tname, src, MULTI, False, special)
        add(tname + "/think_history", tname, src, THINK, True, special)
    add("qwen3/thinking_off", "qwen3", qwen3, MULTI, True, qwen3_special, {"enable_thinking": False})
    add("qwen3/thinking_on", "qwen3", qwen3, MULTI, True, qwen3_special, {"enable_thinking": True})
    add("qwen3/think_last", "qwen3", qwen3, THINK_LAST, False, qwen3_special)
    add("qwen3/tools", "qwen3", qwen3, SYS_USER, True, qwen3_special, {"tools": TOOLS})
    add("qwen3/tool_turns", "qwen3", qwen3, TOOL_TURNS, True, qwen3_special, {"tools": TOOLS}, raw_messages=True)
    add("llama3_2/system_user_date", "llama3_2", llama32, SYS_USER, True, llama32_special, {"date_string": "26 Jul 2024"})
    add("llama3_2/strftime_now", "llama3_2", llama32, MULTI, True, llama32_special)
    add("llama3_2/tools_in_user", "llama3_2", llama32, SYS_USER, True, llama32_special, {"tools": TOOLS, "date_string": "01 Feb 2025"})
    add("llama3_2/tools_in_system", "llama3_2", llama32, SYS_USER, False, llama32_special,
        {"tools": TOOLS, "tools_in_user_message": False, "date_string": "01 Feb 2025"})
    add("llama3_2/tool_turns", "llama3_2", llama32, TOOL_TURNS, True, llama32_special, {"tools": TOOLS, "tools_in_user_message": False}, raw_messages=True)
    return out


# Snippets pin Jinja2 semantics the real templates lean on, one at a time.
SNIPPETS = [
    "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 10 %}{{ x }};{% endfor %}{{ x }}",
    "{% for i in [1, 2] %}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}",
    "{% if true %}{% set z = 5 %}{% endif %}{{ z }}",
    "{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
    "{{ [1, 'a', none, true, 1.0, 1e20, 0.0001, 1e-5, {'k': 'v'}, (1,), (1, 2)] }}",
    "{{ \"it's\" ~ [\"it's\", 'a\"b', 'x\\ny', 'back\\\\slash'] }}",
    "  {# c #}\nA\n  {% if true %}\n  B\n{% endif %}\n",
    "a\n  {%+ if true %}x{% endif %}\n  {{ 'y' }}\n{%- if true -%}\n  z  \n{%- endif %}\n\n",
    "{{ {'a': {'b': 1}} }}|{{ {'a': {'b': 1}}['a']['b'] }}",
    "{{ 'abcdef'[::-1] }} {{ 'abcdef'[1:4] }} {{ [1,2,3][1:] }} {{ [1,2,3,4,5][::2] }} {{ [1,2,3,4,5][-2:] }} {{ [1,2,3][:-1] }} {{ [1,2,3,4][3:0:-1] }}",
    "{{ ' a  b '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ 'x</think>y'.split('</think>')[-1] }}",
    "{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ -7 // 2 }} {{ 2 ** 10 }} {{ 1 == 1.0 }} {{ 10 / 5 }} {{ 3 * 'ab' }} {{ 1 + 2 * 3 - 4 }}",
    "{{ x | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ none | default('d') }}",
    "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ [] | tojson(indent=2) }}|{{ 'é\\t\\u0001' | tojson }}",
    "{{ m.get('a') }} {{ m['items'] }} {{ m.get('zz', 'def') }} {% for k, v in m.items() %}{{ k }}={{ v }},{% endfor %}",
    "{% for a, b in m | items %}{{ a }}={{ b }}{{ loop.length }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }},{% endfor %}",
    "{{ 'x' if false }}|{{ 1 if true else 2 }}|{{ 'a' if none else 'b' if 0 else 'c' }}",
    "{{ '  hi  ' | trim }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}|{{ 'hi\\n\\n'.rstrip() }}|{{ 'Hello' | upper }}{{ 'Hello' | lower }}",
    "{{ 'abc'.startswith('a') }} {{ 'abc'.endswith('bc') }} {{ 'abc'.startswith(('x', 'a')) }} {{ 'b' in 'abc' }} {{ 'z' not in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }}",
    "{{ [1, 2, 3] | length }} {{ 'héllo' | length }} {{ {'a': 1} | length }} {{ [3, 1] | first }} {{ [3, 1] | last }} {{ [1, 2] | join('-') }}",
    "{{ ['a', 'code_interpreter', 'b'] | reject('equalto', 'code_interpreter') | join(', ') }}",
    "{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ m is mapping }} {{ [1] is iterable }} {{ 1 is number }} {{ false is false }} {{ 3 is odd }} {{ 4 is divisibleby 2 }} {{ x is not defined }}",
    "{{ not true or false and true }} {{ 1 < 2 < 3 }} {{ 2 > 1 >= 1 != 0 }} {{ [] or 'e' }} {{ 'a' and 'b' }}",
    "{{ 'a' + 'b' ~ 1 ~ none }}|{{ x ~ 'tail' }}|{{ 'abc' | replace('b', 'B') }}|{{ 'héllo wörld' | title }}|{{ 'hELLO' | capitalize }}",
    "{%- for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for i in [] %}x{% else %}empty{% endfor %}|{% for i in range(5) if i is odd %}{{ i }}{% endfor %}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set blk %}in{{ 'side' }}{% endset %}{{ blk }}|{{ (1, 2) }}|{{ 'ab' 'cd' }}",
    "{{ m | tojson }}|{{ [m] | tojson(indent=4) }}|{{ m.items() | list }}|{{ m.keys() | list }}",
    "{{ 3 | string + 'x' }} {{ [1, 2] | string }} {{ '5' | int + 1 }} {{ 5 | float }} {{ -3 | abs }} {{ ['b', 'a'] | sort }} {{ [{'n': 'x'}, {'n': 'y'}] | map(attribute='n') | join }}",
    "{{ messages[0]['content'] }}|{{ messages[0].content }}|{{ messages | length }}|{{ messages[-1].role }}|{{ messages[5] is defined }}",
    "{{ strftime_now('%Y-%m-%d %H:%M:%S %a %A %b %B %j %p %I %y') }}",
    "{# comment -#}   x {#- trimmed #}\n{{ 1 -}}   \n  {{- 2 }}",
    "{{ \"a,b it's x_y.z {'k': 1} hello-world(foo)<b>\\tTAB\" | title }}|{{ \"a,b it's x_y.z 3a\".title() }}",
    "{{ x is callable }} {{ none is callable }} {{ 'a'.upper is callable }} {{ m.a is callable }}",
    "{{ '' is lower }} {{ '2' is upper }} {{ 'a2' is lower }} {{ 'A2' is upper }} {{ 'aB' is lower }} {{ m is lower }} {{ 12 is upper }} {{ 'ǅ' is upper }} {{ x is lower }}",
]
SNIPPET_VARS = {"d": {"b": [1, 2.5, None, True, "é<>&'\"\n"], "a": {}}, "m": {"a": 1, "items": 2}}
SNIPPET_MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]

# Errors pin where Jinja2 refuses a template (the Go side checks line:col).
ERRORS = [
    ("{{ x.y }}", "render"),
    ("{{ x + 'a' }}", "render"),
    ("{{ raise_exception('boom') }}", "render"),
    ("{{ 1 + 'a' }}", "render"),
    ("{% if %}", "parse"),
    ("{% for x in y %}", "parse"),
    ("{{ 'abc }}", "parse"),
    ("line1\n{% endfor %}", "parse"),
    ("{{ (1 }}", "parse"),
    ("{% macro m() %}{% endmacro %}", "unsupported"),
]


def snippets():
    out = []
    for src in SNIPPETS:
        out.append({"template": src, "expected": render(src, SNIPPET_MESSAGES, False, SNIPPET_VARS)})
    for src, kind in ERRORS:
        if kind == "unsupported":
            # Valid Jinja2 that this subset rejects on purpose.
            out.append({"template": src, "error": kind})
            continue
        try:
            render(src, SNIPPET_MESSAGES, False, SNIPPET_VARS)
        except jinja2.exceptions.TemplateError:
            out.append({"template": src, "error": kind})
            continue
        except TypeError:
            out.append({"template": src, "error": kind})
            continue
        raise SystemExit("expected an error from %r" % src)
    return out


def main():
    doc = {
        "generator": "chat/testdata/gen/gen.py, jinja2 %s with transformers' chat template environment" % jinja2.__version__,
        "now": FIXED_NOW.isoformat(),
        "snippet_vars": SNIPPET_VARS,
        "snippet_messages": SNIPPET_MESSAGES,
        "cases": cases(),
        "snippets": snippets(),
    }
    with open("../expected.json", "w") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
