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


@hookspec
def transformer_kit_onnx_translations() -> dict:  # type: ignore[empty-body]
    """Return ONNX translations for custom torch ops this plugin's components call.

    A mapping from a torch operator (e.g. ``torch.ops.my_plugin.fused_norm.default``) to an
    onnxscript function that builds its ONNX (or onnxruntime contrib) nodes; the export layer
    passes them to ``torch.onnx.export(custom_translation_table=...)``.
    """
