"""Parametrizes the family tests by the checkpoints their class lists (see parity.FamilyParity)."""

from __future__ import annotations

import pytest

from tests.plugins.families import parity


def pytest_generate_tests(metafunc):
    if "checkpoint_name" in metafunc.fixturenames:
        names = list(metafunc.cls.CHECKPOINTS)
        metafunc.parametrize("checkpoint_name", names, ids=names, scope="class")


@pytest.fixture(scope="class")
def checkpoint(request, checkpoint_name, tmp_path_factory):
    """(transformers' model, ours loaded with from_hf, the checkpoint folder)."""
    folder = tmp_path_factory.mktemp(checkpoint_name.replace("+", "_"))
    return parity.load(checkpoint_name, request.cls.CHECKPOINTS[checkpoint_name], folder)
