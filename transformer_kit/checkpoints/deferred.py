"""Checkpoint tensors that are read when they are needed, not when the checkpoint is opened.

:func:`open_checkpoint_tensors` returns every tensor of a checkpoint as a
:class:`DeferredTensor`: a tensor on PyTorch's ``meta`` device (its shape and dtype, no data)
that remembers where it comes from. A family's mapping (``to_state_dict``) runs on them as on
real tensors: slicing, ``.T``, ``reshape``, ``torch.cat``, a scale factor are recorded, not
computed. :func:`materialize` then reads one result at a time from its safetensors shard and
applies what was recorded. So converting a checkpoint never holds
more than a tensor or two in memory, whatever its size, and a family plugin needs no code of
its own for that.

Floating tensors read as float32 (a bfloat16 or float16 checkpoint's values exactly), as
:func:`transformer_kit.checkpoints.reader.read_hf_weights` gives them.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_map

from transformer_kit.core.errors import CheckpointError

_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


class DeferredTensor(Tensor):
    """A tensor whose values are not read yet: shape and dtype on the ``meta`` device, and how
    to compute it (``recipe``: a read, or a torch call on other tensors)."""

    recipe: tuple

    @staticmethod
    def __new__(cls, meta: Tensor, recipe: tuple) -> DeferredTensor:
        tensor = Tensor._make_subclass(cls, meta, False)
        tensor.recipe = recipe
        return tensor

    @classmethod
    def __torch_function__(cls, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **kwargs)
        if isinstance(result, Tensor) and result.is_meta:
            return DeferredTensor(result, ("call", func, args, kwargs))
        if isinstance(result, (tuple, list)) and result and all(isinstance(r, Tensor) for r in result):
            return type(result)(DeferredTensor(r, ("item", func, args, kwargs, i))
                                for i, r in enumerate(result))
        return result  # shapes, dtypes, sizes

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"DeferredTensor(shape={tuple(self.shape)}, dtype={self.dtype})"


def materialize(value: Any) -> Any:
    """``value`` with every :class:`DeferredTensor` in it read and computed (plain tensors)."""
    if not isinstance(value, DeferredTensor):
        return tree_map(materialize, value) if isinstance(value, (list, tuple, dict)) else value
    recipe = value.recipe
    if recipe[0] == "read":
        return recipe[1](recipe[2])
    func, args, kwargs = recipe[1:4]
    result = func(*materialize(args), **materialize(kwargs))
    return result[recipe[4]] if recipe[0] == "item" else result


class SharedRead:
    """Parts computed from the same checkpoint tensors (``inputs``), read once for all the parts:
    a layer's stacked experts read expert by expert. A part's deferred recipe would otherwise
    read the whole inputs again for each part, as the reader keeps only the last tensor it read
    and the parts' reads alternate with others. The inputs are dropped after ``reads`` parts were
    read (a read after that reads them again: slower, never wrong)."""

    def __init__(self, inputs: tuple[Tensor, ...], reads: int) -> None:
        self.inputs, self.reads = inputs, reads
        self._raw: tuple[Tensor, ...] | None = None
        self._done = 0

    def part(self, compute: Callable[..., Tensor], shape: tuple[int, ...],
             dtype: torch.dtype = torch.float32) -> Tensor:
        """``compute(*inputs)`` (of ``shape`` and ``dtype``): deferred when an input is."""
        if not any(isinstance(t, DeferredTensor) for t in self.inputs):
            return compute(*self.inputs)
        return DeferredTensor(torch.empty(shape, dtype=dtype, device="meta"), ("read", self._read, compute))

    def _read(self, compute: Callable[..., Tensor]) -> Tensor:
        if self._raw is None:
            self._raw = tuple(materialize(t) for t in self.inputs)
        # contiguous: never a view that would keep the whole inputs alive
        result = compute(*self._raw).contiguous()
        self._done += 1
        if self._done >= self.reads:
            self._raw, self._done = None, 0
        return result


class _Shards:
    """Reads tensors from safetensors shards with plain reads at their offsets, floats as
    float32. Not through a memory map: a map's pages would count in the process's resident
    memory once read, as much as the whole checkpoint by the end. The last tensor read is kept
    (a fused matrix split into three is read once)."""

    def __init__(self, files: dict[str, Path], folder: Path) -> None:
        self.files = files  # tensor name -> shard
        self.folder = folder
        self.headers: dict[Path, tuple[int, dict]] = {}
        self.read = functools.lru_cache(maxsize=1)(self._read)

    def header(self, shard: Path) -> tuple[int, dict]:
        """(where the data starts, {name: {dtype, shape, data_offsets}}) of ``shard``."""
        if shard not in self.headers:
            if not shard.is_file():
                names = sorted(n for n, f in self.files.items() if f == shard)
                raise CheckpointError(
                    f"The checkpoint in {str(self.folder)!r} names the shard {shard.name!r} for "
                    f"{len(names)} tensors ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}), "
                    "but that file is missing. Copy the whole checkpoint folder again.")
            self.headers[shard] = read_safetensors_header(shard)
        return self.headers[shard]

    def _read(self, name: str) -> Tensor:
        shard = self.files[name]
        start, entries = self.header(shard)
        entry = entries[name]
        begin, end = entry["data_offsets"]
        with shard.open("rb") as file:
            file.seek(start + begin)
            data = bytearray(end - begin)
            if file.readinto(data) != end - begin:
                raise CheckpointError(f"{str(shard)!r} ends inside tensor {name!r}: the file is "
                                      "truncated. Copy the checkpoint again.")
        dtype = _SAFETENSORS_DTYPES[entry["dtype"]]
        tensor = (torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype))
        tensor = tensor.reshape(entry["shape"])
        return tensor.float() if tensor.is_floating_point() else tensor

    def deferred(self) -> dict[str, DeferredTensor]:
        found = {}
        for name, shard in self.files.items():
            entry = self.header(shard)[1].get(name)
            if entry is None:
                raise CheckpointError(f"The checkpoint's index names {name!r} in {shard.name!r}, "
                                      "which does not hold it. Copy the checkpoint again.")
            dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
            if dtype is None:
                raise CheckpointError(f"{name!r} in {str(shard)!r} has dtype {entry['dtype']}, which "
                                      f"the kit does not read ({', '.join(_SAFETENSORS_DTYPES)}).")
            dtype = torch.float32 if dtype.is_floating_point else dtype
            meta = torch.empty(entry["shape"], dtype=dtype, device="meta")
            found[name] = DeferredTensor(meta, ("read", self.read, name))
        return found


def read_safetensors_header(shard: Path) -> tuple[int, dict]:
    """(offset of the data, {tensor name: {"dtype", "shape", "data_offsets"}}) of a
    safetensors file: an 8-byte little-endian length, then that many bytes of JSON."""
    try:
        with shard.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            if length > 100_000_000:
                raise ValueError(f"a header of {length} bytes")
            entries = json.loads(file.read(length))
        entries.pop("__metadata__", None)
        for entry in entries.values():
            begin, end = entry["data_offsets"]
            if not (isinstance(entry["shape"], list) and 0 <= begin <= end):
                raise ValueError("a tensor entry without shape or offsets")
        return 8 + length, entries
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error) as exc:
        raise CheckpointError(f"Cannot read the weights in {str(shard)!r}: it is not a readable "
                              f"safetensors file ({exc}). Copy the checkpoint again.") from None


def _index(folder: Path, name: str) -> dict[str, Path]:
    try:
        index = json.loads((folder / name).read_text(encoding="utf-8"))
        return {tensor: folder / shard for tensor, shard in index["weight_map"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"Cannot read {str(folder / name)!r}: {type(exc).__name__}: {exc}. "
                              "It should map every tensor name to its shard ('weight_map').") from None


def open_checkpoint_tensors(folder: str | Path) -> dict[str, Tensor] | None:
    """Every tensor of the safetensors checkpoint in ``folder`` as a :class:`DeferredTensor`
    (nothing read yet), by name; None for a checkpoint in another format."""
    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return _Shards(_files_of(folder / "model.safetensors"), folder).deferred()
    if (folder / "model.safetensors.index.json").is_file():
        return _Shards(_index(folder, "model.safetensors.index.json"), folder).deferred()
    return None


def _files_of(shard: Path) -> dict[str, Path]:
    return dict.fromkeys(read_safetensors_header(shard)[1], shard)
