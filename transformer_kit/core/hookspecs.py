"""Hook specifications: what a transformer_kit plugin may implement. Declarations only.

The kit calls every hook through pluggy (``plugin_manager.hook.<name>()``), so pluggy's
tracing and hook wrappers apply to them as to any pluggy hook.
"""

from __future__ import annotations

import pluggy

from transformer_kit.core.component import CheckpointFamily, Component, Lowering

PROJECT = "transformer_kit"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def transformer_kit_components() -> list[Component]:  # type: ignore[empty-body]
    """Return the components this plugin contributes."""


@hookspec
def transformer_kit_checkpoint_families() -> list[CheckpointFamily]:  # type: ignore[empty-body]
    """Return the Hugging Face checkpoint families (``model_type``s) this plugin can load."""


@hookspec
def transformer_kit_lowerings() -> list[Lowering]:  # type: ignore[empty-body]
    """Return the lowerings this plugin contributes: how components (its own or another
    plugin's) write their ONNX nodes. The export traces a component that has none."""


@hookspec
def transformer_kit_onnx_translations() -> dict:  # type: ignore[empty-body]
    """Return ONNX translations for custom torch ops this plugin's components call.

    A mapping from a torch operator (e.g. ``torch.ops.my_plugin.fused_norm.default``) to an
    onnxscript function that builds its ONNX (or onnxruntime contrib) nodes; the export layer
    passes them to ``torch.onnx.export(custom_translation_table=...)`` when it traces a
    component that has no lowering.
    """
