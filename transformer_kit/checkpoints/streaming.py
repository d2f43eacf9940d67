"""Models whose weights stay in their checkpoint until a layer needs them.

``tk.from_hf(folder, stream=True)`` builds the model with its parameters on the ``meta``
device and keeps the family's mapping of the checkpoint as deferred tensors
(:class:`StreamedWeights`): ``export_onnx`` writes them one by one, and
:func:`weights_per_module` runs the model in PyTorch (the export's verification) with each
linear and embedding layer's weights read just before it runs and dropped after, so a model of
any size runs in the memory of its largest layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from transformer_kit.checkpoints.deferred import materialize
from transformer_kit.core.errors import InputError

#: The layers whose weights are read per call: they hold nearly all the bytes, and the kit
#: calls them as modules (so their forward hooks run).
STREAMED_LAYERS = (nn.Linear, nn.Embedding)
#: ... when they are at least this large; smaller ones (BERT's token-type table, whose row 0 is
#: read directly) are read once for the whole block, as norms are.
STREAMED_MIN_ELEMENTS = 1 << 16


class StreamedWeights:
    """The model's tensors by state-dict name, each read from the checkpoint when loaded."""

    def __init__(self, state: dict[str, Tensor], folder: str) -> None:
        self.state = state
        self.folder = folder

    def load(self, name: str) -> Tensor:
        """The tensor ``name`` as the family maps it (floats in float32), read now."""
        return materialize(self.state[name])


def _refuse_meta_call(module: nn.Module, args: tuple) -> None:
    raise InputError(
        "This model was loaded with stream=True: its weights stay in the checkpoint and are read "
        "only by export_onnx. Load it without stream=True (dtype='bfloat16' halves its memory) "
        "to run it in PyTorch.")


def guard_streamed(model: nn.Module) -> None:
    """Calling ``model``'s layers outside :func:`weights_per_module` raises :class:`InputError`
    (instead of PyTorch's error about meta tensors)."""
    for module in model.modules():
        if isinstance(module, STREAMED_LAYERS):
            _guard(module)


def drop_guards(model: nn.Module) -> None:
    """Remove what :func:`guard_streamed` added (from a copy of a streamed model's component that
    the export traces)."""
    for module in model.modules():
        module.__dict__.pop("_streaming_guard", None)
        for key in [k for k, hook in module._forward_pre_hooks.items() if hook is _refuse_meta_call]:
            del module._forward_pre_hooks[key]


def _guard(module: nn.Module) -> None:
    module._streaming_guard = module.register_forward_pre_hook(_refuse_meta_call)


def _read_per_call(module: nn.Module, own: list[tuple[str, nn.Parameter]],
                   read: Callable[[nn.Parameter], nn.Parameter], dtype: torch.dtype) -> list:
    """Give ``module`` its weights (``own``) just before each call and shapes only between
    calls (meta, in ``dtype``: caches are made like them); returns the hooks' handles."""
    originals = dict(own)
    empty = {name: nn.Parameter(torch.empty_like(p, device="meta", dtype=dtype), requires_grad=False)
             for name, p in own}
    module._parameters.update(empty)

    def before(mod: nn.Module, args: tuple) -> None:
        for name, param in originals.items():
            mod._parameters[name] = read(param)

    def after(mod: nn.Module, args: tuple, output: object) -> None:
        mod._parameters.update(empty)

    return [module.register_forward_pre_hook(before), module.register_forward_hook(after)]


def _cast_buffers(module: nn.Module, dtype: torch.dtype,
                  saved: list[tuple[nn.Module, str, Tensor]]) -> None:
    """``module``'s own floating-point buffers cast to ``dtype``, each original appended to
    ``saved`` (module, name, buffer) before it is replaced."""
    for name, buffer in module._buffers.items():
        if buffer is not None and buffer.is_floating_point():
            saved.append((module, name, buffer))
            module._buffers[name] = buffer.to(dtype)


def _restore(handles: list, unguarded: list[nn.Module],
             saved_params: list[tuple[nn.Module, str, nn.Parameter]],
             saved_buffers: list[tuple[nn.Module, str, Tensor]]) -> None:
    """Undo :func:`weights_per_module`: its hooks removed, the streamed layers guarded again,
    every parameter and buffer put back."""
    for handle in handles:
        handle.remove()
    for module in unguarded:
        _guard(module)
    for module, name, param in saved_params:
        module._parameters[name] = param
    for module, name, buffer in saved_buffers:
        module._buffers[name] = buffer


@contextlib.contextmanager
def weights_per_module(model: nn.Module, load: Callable[[str], Tensor],
                       dtype: torch.dtype) -> Iterator[None]:
    """While active, ``model`` runs in ``dtype`` with its weights read by ``load(name)``: each
    large linear and embedding layer's just before it runs (dropped after), the others (norms,
    small tables) once for the whole block. Buffers are cast to ``dtype`` too. On exit
    every parameter and buffer is as before, whatever happened."""
    saved_params: list[tuple[nn.Module, str, nn.Parameter]] = []
    saved_buffers: list[tuple[nn.Module, str, Tensor]] = []
    handles: list = []
    unguarded: list[nn.Module] = []  # streamed models' layers, guarded again on exit
    owner = {id(p): name for name, p in model.named_parameters()}  # a tied weight: one name

    def read(param: nn.Parameter) -> nn.Parameter:
        return nn.Parameter(load(owner[id(param)]).to(dtype), requires_grad=False)

    try:
        for module in model.modules():
            own = [(name, p) for name, p in module._parameters.items() if p is not None]
            saved_params.extend((module, name, p) for name, p in own)
            _cast_buffers(module, dtype, saved_buffers)
            if "_streaming_guard" in module.__dict__:
                module.__dict__.pop("_streaming_guard").remove()
                unguarded.append(module)
            large = sum(p.numel() for _, p in own) >= STREAMED_MIN_ELEMENTS
            if own and isinstance(module, STREAMED_LAYERS) and large:
                handles.extend(_read_per_call(module, own, read, dtype))
            else:
                for name, param in own:
                    module._parameters[name] = read(param)
        yield
    finally:
        _restore(handles, unguarded, saved_params, saved_buffers)
