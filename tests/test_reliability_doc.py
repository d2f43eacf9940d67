"""Every test RELIABILITY.md names exists: ``path.py::test_name`` (and ``::other`` for another test
of the same file), read from the document and looked up in the test files' source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).parent
DOCUMENT = TESTS.parent / "RELIABILITY.md"


def _references() -> list[tuple[str, str]]:
    found = []
    for row in DOCUMENT.read_text().splitlines():
        current = None
        for ref in re.findall(r"`([\w/]+\.py)?::(\w+)(?:\[[^\]]*\])?`", row):
            path, name = ref
            current = path or current
            assert current, f"'::{name}' follows no test file in: {row}"
            found.append((current, name))
    return found


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def test_every_test_the_document_names_exists():
    references = _references()
    assert len(references) > 80
    missing = [f"{path}::{name}" for path, name in references
               if not (TESTS / path).is_file() or name not in _tests_in(TESTS / path)]
    assert not missing, missing
