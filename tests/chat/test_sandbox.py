"""A chat template is code from a checkpoint: the sandbox holds. Python's internals are out of
reach, and a template that loops without end or grows without bound is stopped with a sentence,
never a hang."""

from __future__ import annotations

import pytest

from transformer_kit.chat import sandbox
from transformer_kit.chat.templates import render_conversation
from transformer_kit.core.errors import ChatTemplateError

HELLO = [{"role": "user", "content": "hello"}]
ESCAPES = [
    "{{ messages.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('echo escaped') }}",
    "{{ raise_exception.__globals__['__builtins__'] }}",
    "{{ ''.__class__.__base__.__subclasses__() }}",
    "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
    "{{ messages.append({'role': 'system'}) }}",  # the immutable sandbox: no mutation
    "{{ dict.__class__ }}{{ dict.fromkeys.__self__.__class__.__subclasses__() }}",
]


@pytest.mark.parametrize("template", ESCAPES)
def test_python_internals_are_out_of_reach(template):
    try:
        rendered = render_conversation(template, HELLO, special_tokens={})
    except ChatTemplateError as exc:
        assert "sandbox" in str(exc) or "refused" in str(exc) or "failed" in str(exc)
    else:  # jinja2 renders an unsafe attribute as undefined (empty) where it does not raise
        assert "class" not in rendered and "escaped" not in rendered and rendered.strip() in ("", "None")


def test_a_template_that_loops_without_end_is_stopped():
    template = sandbox.compile_template(
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}")
    with pytest.raises(ChatTemplateError, match="ran longer than"):
        sandbox.render(template, {}, seconds=0.5)


def test_a_template_that_grows_without_bound_is_stopped():
    template = sandbox.compile_template(
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s | length }}")
    with pytest.raises(ChatTemplateError, match="grow"):
        sandbox.render(template, {}, growth=64 << 20)


@pytest.mark.parametrize("template", ["{{ 'x' * 1000000000 }}", "{{ [1] * 100000000 }}",
                                      "{{ 10 ** 100000000 }}"])
def test_one_operation_cannot_take_the_memory(template):
    with pytest.raises(ChatTemplateError, match="sandbox"):
        render_conversation(template, HELLO, special_tokens={})


def test_a_syntax_error_and_a_refusal_are_sentences():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        render_conversation("{% for m in messages %}", HELLO, special_tokens={})
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        render_conversation("{{ raise_exception('System role not supported') }}", HELLO,
                            special_tokens={})


def test_the_tracer_before_a_render_is_put_back():
    import sys

    def tracer(frame, event, arg):
        return None

    sys.settrace(tracer)
    try:
        render_conversation("{{ messages[0].content }}", HELLO, special_tokens={})
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)


def test_what_a_template_sees_is_plain_data():
    class Rich:
        def delete_everything(self):  # pragma: no cover - must never be reachable
            raise AssertionError

    rendered = render_conversation("{{ messages[0].content }}", [{"role": "user", "content": Rich()}],
                                   special_tokens={})
    assert rendered == "<Rich>"
