"""The example third-party package installs with pip, is found through its entry point, and a
model naming its component builds, exports (by the component's own lowering) and runs; its own
tests pass (one exports a component without a lowering, traced)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "examples" / "cosine-attention-plugin"


@pytest.fixture(scope="module")
def plugin_python(tmp_path_factory) -> Path:
    """A new virtual environment with transformer-kit and the plugin installed into it by pip
    (regular installs, as a user's), seeing this environment's third-party packages (torch,
    onnxruntime ...) through a .pth file so that nothing heavy is downloaded again."""
    env_dir = tmp_path_factory.mktemp("plugin-venv")
    # without a pip of its own (making one costs seconds): this environment's pip installs into it
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    dependencies = [p for p in sys.path if p.endswith("site-packages")]
    Path(site, "dependencies.pth").write_text("\n".join(dependencies) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet",
         str(ROOT), str(PACKAGE)],
        capture_output=True, text=True, check=False, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    where = subprocess.run([str(python), "-c", "import transformer_kit; print(transformer_kit.__file__)"],
                           capture_output=True, text=True, cwd=env_dir, check=False)
    assert where.stdout.startswith(site), (where.stdout, where.stderr)  # its own copy, not ours
    return python


def _run(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, cwd=cwd, timeout=600, check=False)


def test_installed_plugin_builds_exports_and_runs(plugin_python, tmp_path):
    result = _run(plugin_python, f"""
        import numpy as np, torch
        import transformer_kit as tk
        from transformer_kit.runtime import OnnxModel
        from transformer_kit.export import export_onnx
        entry = tk.get_registry().entry("attention", "cosine")
        print("plugin", entry.plugin, entry.distribution)
        torch.manual_seed(0)
        model = tk.build_model({{"architecture": "decoder", "vocab_size": 30, "d_model": 16,
            "num_heads": 4, "num_kv_heads": 2, "num_layers": 2, "d_ff": 32, "dropout": 0.0,
            "attention": {{"name": "cosine", "temperature": 8.0}}, "positional": "rotary"}})
        report = export_onnx(model, {str(tmp_path / "onnx")!r})
        om = OnnxModel({str(tmp_path / "onnx")!r})
        ids = np.array([[4, 5, 6, 7], [8, 9, 0, 0]])
        same = np.array_equal(om.generate(ids, 6), model.generate(torch.from_numpy(ids), 6).numpy())
        print("error", report.max_error, "same", same)
        print("traced", sorted(report.traced_components) or None)  # its lowering wrote the kernel
    """, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "plugin cosine_attention transformer-kit-cosine-attention" in lines
    error_line = next(li for li in lines if li.startswith("error"))
    _, error, _, same = error_line.split()
    assert float(error) <= 1e-4 and same == "True"
    assert "traced None" in lines
    listing = subprocess.run([str(plugin_python), "-m", "transformer_kit", "components", "--kind",
                              "attention"], capture_output=True, text=True, check=False,
                             env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert "transformer-kit-cosine-attention" in listing.stdout


def test_the_plugins_own_tests_pass(plugin_python):
    result = subprocess.run([str(plugin_python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(PACKAGE / "tests")], capture_output=True, text=True, cwd=PACKAGE,
                            check=False)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "4 passed" in result.stdout
