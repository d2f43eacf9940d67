"""The published JSON schema (``transformer-kit config schema``) accepts what the kit accepts:
every config shipped in the repository and written in its docs, and random valid configs; and
it refuses what a schema can see is wrong."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given, settings

import transformer_kit as tk
from tests.core.test_config_properties import valid_configs

ROOT = Path(__file__).parent.parent.parent
SCHEMA = tk.ModelConfig.model_json_schema()


def _shipped_configs() -> dict[str, dict]:
    """Config files in the package, and every YAML block in README and docs holding a config."""
    found = {str(p.relative_to(ROOT)): yaml.safe_load(p.read_text())
             for p in sorted((ROOT / "transformer_kit").rglob("*.yaml"))}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(), flags=re.S)):
            data = yaml.safe_load(block)
            if isinstance(data, dict) and "architecture" in data:
                found[f"{doc.name} block {i}"] = data
    return found


SHIPPED = _shipped_configs()


def test_the_shipped_configs_are_found():
    assert {"transformer_kit/configs/paper.yaml", "transformer_kit/apps/demo.yaml"} <= set(SHIPPED)
    assert any(name.startswith("config.md") for name in SHIPPED)  # the config reference's


@pytest.mark.parametrize("name", list(SHIPPED))
def test_every_shipped_config_is_valid_for_the_kit_and_its_schema(name):
    tk.load_config(SHIPPED[name])  # the kit accepts it
    jsonschema.validate(SHIPPED[name], SCHEMA)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(valid_configs())
def test_every_random_valid_config_is_valid_for_the_schema(config):
    jsonschema.validate(config, SCHEMA)


@pytest.mark.parametrize("config", [
    {"vocab_size": 10, "d_model": "512"},
    {"vocab_size": 10, "attention": 5},
    {"vocab_size": 10, "positional": {"base": 5}},
    {"vocab_size": 10, "dropuot": 0.1},
    {"vocab_size": 10, "bos_id": -1},
])
def test_the_schema_refuses_what_the_kit_refuses(config):
    with pytest.raises(tk.ConfigError):
        tk.load_config(config)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, SCHEMA)
