"""The running batch's cache moves (join with left padding, gather, trim) equal numpy's, and a
batch whose rows join and leave between steps decodes each row as it decodes alone."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel
from transformer_kit.runtime.cache_ops import CacheOps


def _values(arrays):
    return [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]


def test_join_gather_and_trim_move_rows_and_columns_as_numpy_does():
    rng = np.random.default_rng(0)
    a = [rng.standard_normal((2, 3, 4, 5)).astype(np.float32) for _ in range(3)]
    b = [rng.standard_normal((1, 3, 6, 5)).astype(np.float32) for _ in range(3)]
    ops = CacheOps(["CPUExecutionProvider"], "cpu")
    joined = [v.numpy() for v in ops.join(_values(a), _values(b), 2, 0)]
    for x, y, out in zip(a, b, joined, strict=True):
        expected = np.concatenate([np.pad(x, ((0, 0), (0, 0), (2, 0), (0, 0))), y], axis=0)
        np.testing.assert_array_equal(out, expected)
    gathered = [v.numpy() for v in ops.gather(_values(joined), np.array([2, 0]))]
    trimmed = [v.numpy() for v in ops.trim(_values(gathered), 2)]
    for out, g, t in zip(joined, gathered, trimmed, strict=True):
        np.testing.assert_array_equal(g, out[[2, 0]])
        np.testing.assert_array_equal(t, out[[2, 0]][:, :, 2:])


def test_pad_adds_zero_columns_on_either_side_as_numpy_does():
    a = [np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)]
    ops = CacheOps(["CPUExecutionProvider"], "cpu")
    (out,) = ops.pad(_values(a), 3, 5)
    np.testing.assert_array_equal(out.numpy(), np.pad(a[0], ((0, 0), (0, 0), (3, 5), (0, 0))))


def test_rows_joining_and_leaving_decode_as_each_alone(tmp_path):
    """Without batch invariance: rows prefilled together (left-padded), alone, or picked out of
    a prefilled block join a running batch at any step and leave it; each gets the tokens it
    gets alone (this model has no near-ties; tests/runtime/test_batch_invariance.py has the
    bit-for-bit layout)."""
    torch.manual_seed(0)
    export_onnx(tk.build_model(tiny_config("decoder", positional="rotary")), tmp_path / "onnx")
    model = OnnxModel(tmp_path / "onnx", providers="cpu", batch_invariant=False)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 37, n) for n in (7, 2, 11, 4)]
    lengths = [9, 14, 5, 12]
    alone = [model.generate(p[None], attention_mask=np.ones((1, len(p))), max_new_tokens=n)[0]
             for p, n in zip(prompts, lengths, strict=True)]
    eos = model.manifest.eos_id
    # step -> (prompts prefilled together, which of them join)
    joining = {0: ([0, 1], [0, 1]), 2: ([2], [0]), 4: ([3, 0], [0])}
    batch, tokens, active, step = model.batch_decoder(), {}, [], 0
    while len(tokens) < len(prompts) or active:
        if step in joining:
            together, joins = joining[step]
            rows, logits = batch.prefill([prompts[r] for r in together])
            assert rows.mask.shape == (len(together), max(len(prompts[r]) for r in together))
            if len(joins) < len(together):
                rows = batch.select(rows, np.array(joins))
                assert rows.mask.shape == (len(joins), len(prompts[together[joins[0]]]))
            batch.join(rows)
            for i in joins:
                tokens[together[i]] = [int(logits[i].argmax())]
                active.append(together[i])
        logits = batch.step(np.array([tokens[r][-1] for r in active]))
        for i, r in enumerate(active):
            tokens[r].append(int(logits[i].argmax()))
        kept = [i for i, r in enumerate(active) if len(tokens[r]) < lengths[r]]
        if len(kept) < len(active):
            batch.keep(np.array(kept))
            active = [active[i] for i in kept]
            # as long as its longest row: no column is padding in every row
            assert batch.rows == 0 or batch.mask[:, 0].any()
        step += 1
    for r, expected in enumerate(alone):  # generate ends a row at eos; the loop above does not
        ours = tokens[r][:lengths[r]]
        end = ours.index(eos) + 1 if eos in ours else len(ours)
        np.testing.assert_array_equal(ours[:end], expected[:end])
