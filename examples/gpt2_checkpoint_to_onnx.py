"""A GPT-2-sized checkpoint folder -> transformer_kit model -> ONNX -> generated tokens.

    pip install transformers                      # only to write the example checkpoint
    python examples/gpt2_checkpoint_to_onnx.py --workdir gpt2-demo

1. writes a randomly initialised GPT-2 (124M parameters: d_model 768, 12 layers, 12 heads,
   vocabulary 50257) with ``save_pretrained`` into WORKDIR/checkpoint (no model hub here; point
   ``--checkpoint`` at a real GPT-2 folder to use its weights instead),
2. loads it with ``tk.from_hf`` (transformers is not used for this),
3. exports it with ``export_onnx`` into WORKDIR/onnx (verified against PyTorch),
4. generates greedily with ``OnnxModel`` and checks the tokens against transformers' own
   ``generate`` on the original checkpoint.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

import transformer_kit as tk
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel


def write_checkpoint(folder: Path, layers: int) -> None:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers)  # GPT-2 small's sizes
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="gpt2-demo")
    parser.add_argument("--checkpoint", default=None, help="an existing GPT-2 checkpoint folder")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=20)
    args = parser.parse_args()
    workdir = Path(args.workdir)
    checkpoint = Path(args.checkpoint) if args.checkpoint else workdir / "checkpoint"
    if not args.checkpoint:
        print(f"1. writing a random GPT-2 checkpoint to {checkpoint}")
        write_checkpoint(checkpoint, args.layers)

    print(f"2. loading {checkpoint} with tk.from_hf")
    # GPT-2 has no padding token: prompts of different lengths batch with an attention mask.
    model = tk.from_hf(checkpoint)
    print(f"   {sum(p.numel() for p in model.parameters()):,} parameters; config:",
          model.config.to_dict())

    print(f"3. exporting to {workdir / 'onnx'}")
    print(export_onnx(model, workdir / "onnx"))

    prompts = np.array([[464, 3290, 286, 262, 2003, 318], [40, 588, 0, 0, 0, 0]])
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]])  # 1 = real token
    om = OnnxModel(workdir / "onnx")
    start = time.perf_counter()
    tokens = om.generate(prompts, max_new_tokens=args.max_new_tokens, attention_mask=mask)
    elapsed = time.perf_counter() - start
    print(f"4. onnxruntime ({om.provider}): {tokens.size / elapsed:.0f} tokens/s")
    print(f"   generated: {tokens.tolist()}")

    import transformers

    reference = transformers.GPT2LMHeadModel.from_pretrained(checkpoint).eval()
    ours = model.generate(torch.from_numpy(prompts), max_new_tokens=args.max_new_tokens,
                          attention_mask=torch.from_numpy(mask)).numpy()
    for row, prompt in enumerate(prompts):
        ids = torch.from_numpy(prompt[mask[row] == 1])[None]
        with torch.no_grad():
            out = reference.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     num_beams=1, max_new_tokens=args.max_new_tokens,
                                     pad_token_id=0)
        expected = out[0, ids.shape[1]:].numpy()
        same = np.array_equal(tokens[row, : len(expected)], expected)
        print(f"   row {row}: onnxruntime == transformers: {same}; PyTorch kit == transformers: "
              f"{np.array_equal(ours[row, : len(expected)], expected)}")


if __name__ == "__main__":
    main()
