"""The structure holds: import-linter's contracts (layers core <- chat <- tokenizer <- checkpoints |
runtime <- plugins <- export <- apps, a root that imports only the core, no import cycles, a
runtime without torch, onnx-ir, the plugins or the export) pass, and they fail when broken; the
core imports no outer layer, even inside a function; no package reads another package's private
names; the front-ends (the servers, the command line) neither tokenize nor choose between
engines; the installed package holds none of the helpers the tests and benchmarks share
(testbed/)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "transformer_kit"
OUTER_LAYERS = ("apps", "export", "plugins", "runtime")


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the package found first under ``root`` (its copy, or this checkout)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports, "import-linter is a dev dependency: pip install -e '.[dev]'"
    command = [lint_imports, "--config", str(root / "pyproject.toml")]
    return subprocess.run(command, capture_output=True, text=True, cwd=root, env=env, timeout=300,
                          check=False)


def test_the_import_contracts_are_kept():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "4 kept, 0 broken" in result.stdout


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(PACKAGE, tmp_path / "transformer_kit",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("core/config.py", "import transformer_kit.runtime.onnx_model", "Layers point one way"),
    ("core/registry.py", "import transformer_kit.apps.benchmark", "Layers point one way"),
    ("plugins/attention.py", "from transformer_kit.export import graphs", "Layers point one way"),
    ("__init__.py", "import transformer_kit.plugins", "The package root imports the core and the checkpoint"),
    ("core/model.py", "import transformer_kit.chat.sandbox", "Layers point one way"),
    ("core/decoding/search.py", "from transformer_kit.tokenizer import TextTokenizer",
     "Layers point one way"),
    ("core/embedding/api.py", "import transformer_kit.checkpoints.gguf", "Layers point one way"),
    ("core/errors.py", "import transformer_kit.core.registry", "No import cycles"),
    ("runtime/engine.py", "import torch", "The runtime runs export folders without torch"),
    ("runtime/onnx_model.py", "import onnx_ir", "The runtime runs export folders without torch"),
    ("runtime/service.py", "import transformer_kit.core.model", "The runtime runs export folders without"),
    ("runtime/cache_ops.py", "import transformer_kit.export.exporter", "Layers point one way"),
    ("checkpoints/loading.py", "import transformer_kit.runtime.engine", "Layers point one way"),
])
def test_a_wrong_import_breaks_a_contract(tmp_path, module, line, broken):
    copy = _copy(tmp_path)
    path = copy / "transformer_kit" / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    result = _lint_imports(copy)
    assert result.returncode != 0, result.stdout[-3000:]
    assert f"{broken}" in result.stdout and "BROKEN" in result.stdout


def test_a_new_core_module_must_be_placed_in_a_layer(tmp_path):
    copy = _copy(tmp_path)
    (copy / "transformer_kit" / "stray.py").write_text('"""Nobody placed me."""\n')
    result = _lint_imports(copy)
    assert result.returncode != 0 and "transformer_kit.stray" in result.stdout + result.stderr


def _core_files() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in OUTER_LAYERS]


def _imports(path: Path) -> set[str]:
    """Every module an import statement names in ``path``, at any depth (inside functions too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_core_imports_no_outer_layer():
    outer = tuple(f"transformer_kit.{layer}" for layer in OUTER_LAYERS)
    wrong = {(p.name, name) for p in _core_files() for name in _imports(p) if name.startswith(outer)}
    assert not wrong, wrong


#: The helpers only the tests and benchmarks use, which live in testbed/ (not installed).
TESTBED_MODULES = {"peers", "genai_peer", "random_checkpoints", "triton_local"}


def test_the_installed_package_holds_no_test_or_benchmark_helper():
    stray = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if p.stem in TESTBED_MODULES]
    assert not stray, stray
    imports = {(str(p.relative_to(ROOT)), name) for p in PACKAGE.rglob("*.py") for name in _imports(p)
               if name == "testbed" or name.startswith("testbed.")}
    assert not imports, imports
    assert (ROOT / "testbed" / "__init__.py").is_file()


def _package(path: Path, root: Path) -> str:
    """The package a module belongs to: its first folder under ``root`` ("" for the root's own)."""
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else ""


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_reads_across_packages(root: Path) -> list[str]:
    """``obj._name`` read in one package of ``root`` where ``_name`` is a private name the
    package tree defines only in other packages (a method, a class, a module-level name or an
    attribute set on ``self``): "file:line _name". Third-party privates (torch's
    ``module._parameters``) are not the kit's to forbid; ``self``, ``cls`` and ``super()`` reads
    are a class's own."""
    defined: dict[str, set[str]] = {}
    reads: list[tuple[str, Path, int, str]] = []
    for path in sorted(root.rglob("*.py")):
        package = _package(path, root)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                names += [t.attr for t in targets if isinstance(t, ast.Attribute)
                          and isinstance(t.value, ast.Name) and t.value.id in ("self", "cls")]
            elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                owner = node.value
                own = (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) or (
                    isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super")
                if not own and isinstance(node.ctx, ast.Load):
                    reads.append((package, path, node.lineno, node.attr))
                continue
            else:
                continue
            for name in filter(_is_private, names):
                defined.setdefault(name, set()).add(package)
    return [f"{path.relative_to(root.parent)}:{line} {name}" for package, path, line, name in reads
            if name in defined and package not in defined[name]]


def test_no_package_reads_another_packages_private_names():
    assert private_reads_across_packages(PACKAGE) == []


def test_a_private_read_across_packages_is_found(tmp_path):
    (tmp_path / "kit" / "runtime").mkdir(parents=True)
    (tmp_path / "kit" / "serving").mkdir()
    (tmp_path / "kit" / "runtime" / "model.py").write_text(
        "class Model:\n    def _run(self):\n        self._cache = 1\n        return self._cache\n")
    (tmp_path / "kit" / "serving" / "engine.py").write_text(
        "def serve(model, module):\n    module._parameters\n    return model._run(), model._cache\n")
    assert sorted(private_reads_across_packages(tmp_path / "kit")) == [
        "kit/serving/engine.py:3 _cache", "kit/serving/engine.py:3 _run"]


#: What tokenizes or detokenizes: the runtime does it for every front-end (its Service for the
#: servers, OneShotGeneration and ChatSession for the command line).
TEXT_MODULES = ("transformer_kit.core.decoding.text", "transformer_kit.tokenizer", "transformer_kit.chat",
                "transformer_kit.core.embedding")
TEXT_NAMES = {"tokenizer", "text_encoder", "TextPieces", "TextTokenizer", "ChatTurn", "chat_turn",
              "stop_matcher", "row_texts", "cut_at_stop", "stream_text", "apply_chat_template"}
#: The front-ends: the servers and the command line.
FRONT_ENDS = ("apps/serving", "apps/commands")


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement may bring in: ``from a import b`` may be module a.b."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    module = node.module or ""
    return [module, *(f"{module}.{alias.name}" for alias in node.names)]


def front_end_text_work(folder: Path) -> list[str]:
    """Where a module of ``folder`` imports a tokenizing module, reads a tokenizer or the text
    classes and functions (encoding, stop matching, detokenizing, rendering a chat), or chooses
    by ``isinstance`` between the runtime's engines: "file:line what"."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.name}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                text_modules = [name for name in _imported(node) if name.startswith(TEXT_MODULES)]
                found += [f"{where} imports {text_modules[0]}"] if text_modules else []
            elif isinstance(node, ast.Attribute) and node.attr in TEXT_NAMES:
                found.append(f"{where} reads .{node.attr}")
            elif isinstance(node, ast.Name) and node.id in TEXT_NAMES:
                found.append(f"{where} uses {node.id}")
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance"
                  and "Engine" in ast.unparse(node.args[1])):
                found.append(f"{where} chooses by isinstance: {ast.unparse(node)}")
    return sorted(found, key=lambda f: (f.split(":")[0], int(f.split(":")[1].split()[0])))


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_the_front_ends_neither_tokenize_nor_choose_between_engines(front_end):
    assert front_end_text_work(PACKAGE / front_end) == []


def test_a_front_end_that_tokenizes_is_found(tmp_path):
    (tmp_path / "server.py").write_text(
        "from transformer_kit.core.decoding.text import TextPieces\n"
        "def handle(model, engine, Engine):\n"
        "    ids = model.tokenizer.encode(['hi'])\n"
        "    return isinstance(engine, Engine)\n")
    assert front_end_text_work(tmp_path) == [
        "server.py:1 imports transformer_kit.core.decoding.text", "server.py:3 reads .tokenizer",
        "server.py:4 chooses by isinstance: isinstance(engine, Engine)"]


def test_a_command_that_detokenizes_or_renders_is_found(tmp_path):
    (tmp_path / "command.py").write_text(
        "from transformer_kit.core.decoding import text\n"
        "import transformer_kit.chat.conversation\n"
        "def run(om, tokens, eos_ids, stops, messages):\n"
        "    print(text.row_texts(om.tokenizer, tokens, eos_ids, stops))\n"
        "    matcher = om.tokenizer.stop_matcher(stops)\n"
        "    return om.tokenizer.apply_chat_template(messages), matcher\n")
    assert front_end_text_work(tmp_path) == [
        "command.py:1 imports transformer_kit.core.decoding.text",
        "command.py:2 imports transformer_kit.chat.conversation",
        "command.py:4 reads .row_texts", "command.py:4 reads .tokenizer",
        "command.py:5 reads .stop_matcher", "command.py:5 reads .tokenizer",
        "command.py:6 reads .apply_chat_template", "command.py:6 reads .tokenizer"]
