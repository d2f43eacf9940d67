"""The command as a whole: every command module is registered, help lists them, errors are one
line unless --debug, and ``python -m transformer_kit`` runs the installed command."""

from __future__ import annotations

import pytest

import transformer_kit as tk
from tests.apps.conftest import cli, invoke
from transformer_kit.apps.cli import app, command_modules

COMMANDS = ["bench", "chat", "components", "config", "demo", "embed", "export", "generate", "plot",
            "rerank", "run", "serve", "transcribe", "triton"]


def test_every_command_module_is_a_command():
    assert command_modules() == COMMANDS
    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    names |= {g.name for g in app.registered_groups}
    assert names == set(COMMANDS)


def test_help_lists_every_command_in_a_real_process(tmp_path):
    result = cli("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for name in COMMANDS:
        assert name in result.stdout


def test_errors_are_one_line_unless_debug(tmp_path):
    result = invoke("generate", str(tmp_path / "nope"), "--ids", "1 2")
    assert result.exit_code == 1
    assert "does not exist" in result.output and "Traceback" not in result.output
    debug = invoke("--debug", "generate", str(tmp_path / "nope"), "--ids", "1 2")
    assert isinstance(debug.exception, tk.ArtifactError)
    bad_ids = invoke("generate", str(tmp_path), "--ids", "1 x")
    assert bad_ids.exit_code == 2 and "is not token ids" in bad_ids.output


@pytest.mark.parametrize("flag", ["--ids", "--tgt-ids"])
def test_id_flags_name_themselves_when_wrong(exported, flag):
    _, folder = exported
    args = ["run", str(folder / "onnx"), "--ids", "5 6"] + ([flag, "5 ;"] if flag == "--tgt-ids" else [])
    if flag == "--ids":
        args[3] = "5 ; ; 6"
    result = invoke(*args)
    assert result.exit_code == 2 and flag in result.output and "empty row" in result.output
