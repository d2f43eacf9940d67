"""transformer-kit components: every component and checkpoint family, with plugins and failures."""

from __future__ import annotations

import pytest

import transformer_kit as tk
from tests.apps.conftest import cli, invoke


def test_components_table_lists_every_component_and_family():
    result = invoke("components")
    assert result.exit_code == 0
    for kind in tk.KINDS:
        for name in tk.get_registry().names(kind):
            assert name in result.output
    for model_type in tk.get_registry().model_types():
        assert model_type in result.output
    assert "built-in" in result.output and "fused" in result.output  # sdpa's lowering
    only = invoke("components", "--kind", "norm")
    assert "rmsnorm" in only.output and "sinusoidal" not in only.output
    bad = invoke("components", "--kind", "attn")
    assert bad.exit_code == 1 and "Unknown component kind 'attn'" in bad.output


def test_components_lists_plugins_that_failed(installed_package, fresh_registry):
    installed_package("tk-broken", "tkplugin_broken_cli", "raise RuntimeError('no luck')\n")
    with pytest.warns(RuntimeWarning):
        tk.reset_registry()
    result = invoke("components", "--kind", "norm")
    assert result.exit_code == 0
    assert "not loaded" in result.output and "tkplugin_broken_cli" in result.output
    assert "tk-broken" in result.output and "no luck" in result.output


def test_components_in_a_real_process(tmp_path):
    result = cli("components", "--kind", "block", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "pre_norm" in result.stdout and "post_norm" in result.stdout


def test_output_to_a_pipe_is_plain_and_unwrapped(tmp_path):
    """``components | grep NAME`` finds a whole row: no table row wraps at 80 columns, no colour."""
    result = cli("components", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if "│" in line and "rmsnorm" in line]
    assert rows and all("rmsnorm" in row and "built-in" in row for row in rows[:1])
    assert max(len(line) for line in result.stdout.splitlines()) > 80  # wider than a terminal's 80
    assert "\x1b[" not in result.stdout
