"""Hook specifications: what a transformer_kit plugin may implement. Declarations only."""

from __future__ import annotations

import pluggy

from transformer_kit.component import Component

PROJECT = "transformer_kit"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def transformer_kit_components() -> list[Component]:  # type: ignore[empty-body]
    """Return the components this plugin contributes."""
