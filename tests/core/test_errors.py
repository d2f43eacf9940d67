"""Each error type means one thing, every one is importable from ``transformer_kit``, the base
class is never raised itself, and messages speak of what a user sees (no internal references)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import transformer_kit as tk
from transformer_kit.core import errors

ROOT = Path(__file__).parent.parent.parent


def test_every_error_type_is_exported_and_documented():
    types = [obj for _, obj in inspect.getmembers(errors, inspect.isclass)
             if issubclass(obj, tk.TransformerKitError)]
    assert len(types) == 14
    for error in types:
        assert getattr(tk, error.__name__) is error
        assert error.__doc__
        assert error is tk.TransformerKitError or error.__name__ in errors.__doc__


def test_the_base_error_is_never_raised_itself():
    raised = []
    for path in (ROOT / "transformer_kit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                if isinstance(func, ast.Name) and func.id == "TransformerKitError":
                    raised.append(f"{path.name}:{node.lineno}")
    assert not raised, raised


def test_user_facing_text_never_points_at_internal_documents():
    """Descriptions, help, messages and docs say what a thing is, not which seed article it
    came from (a user has never seen them)."""
    pattern = re.compile(r"\bseeds? ?0\d\d", re.IGNORECASE)
    texts = [p for p in (ROOT / "transformer_kit").rglob("*.py")]
    texts += [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").rglob("*.py")]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in texts for m in pattern.finditer(p.read_text())]
    assert not found, found
    descriptions = [e.component.description for e in tk.get_registry().entries()]
    assert not [d for d in descriptions if "seed" in d.lower()]
