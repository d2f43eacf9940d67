"""testbed/client_env.py: guidellm's environment holds its own click (8.4, its pin) ahead of
this environment's, and imports everything else (torch, transformers) from this one, without
installing it again; a second call finds it made."""

from __future__ import annotations

import json
import subprocess
from importlib import metadata
from pathlib import Path

import torch
import transformers

from testbed.client_env import GUIDELLM, client_env, made

PROBE = """
import json, click, guidellm, torch, transformers
from importlib import metadata
print(json.dumps({m.__name__: m.__file__ for m in (click, guidellm, torch, transformers)}
                 | {"click_version": metadata.version("click")}))
"""


def test_the_client_environment_layers_its_pins_over_this_one():
    python = client_env("guidellm", GUIDELLM)
    assert client_env("guidellm", GUIDELLM) == python  # cached
    own = python.parent.parent.resolve()
    found = json.loads(subprocess.run([str(python), "-c", PROBE], check=True, capture_output=True,
                                      text=True, timeout=300).stdout)
    assert found["click_version"].startswith("8.4.")
    for module in ("click", "guidellm"):
        assert Path(found[module]).resolve().is_relative_to(own), found
    for module in (torch, transformers):  # this environment's own files
        assert Path(found[module.__name__]).resolve() == Path(module.__file__).resolve(), found
        assert not list(own.rglob(f"{module.__name__}-*.dist-info"))
    assert metadata.version("click") != found["click_version"]  # 8.5 here
    assert made(python)["requirements"] == list(GUIDELLM)
    assert made(python)["bytes"] < 200e6  # guidellm's own packages, no torch
