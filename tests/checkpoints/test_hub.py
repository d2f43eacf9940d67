"""Checkpoints by their Hub name: from_hf / config_from_hf / from_gguf on ``org/name`` (and
``org/name:FILE.gguf``) read huggingface_hub's cache offline as they read the folder itself, a
revision picks another snapshot, a local folder of the same name wins, only the files the kit
reads are downloaded (and read offline afterwards), and every refusal (not
cached offline, no such repository, revision or file, a gated repository, a name that is no
path and no repository id) is a CheckpointError sentence. The Hub cannot be reached here: the
cache is filled as huggingface_hub lays it out, and the downloads and online refusals come from
a stand-in server on 127.0.0.1 that speaks the Hub's API."""

from __future__ import annotations

import shutil

import huggingface_hub
import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.chat.checkpoint import write_chat_checkpoint
from tests.checkpoints.gguf.writer import write_gguf
from tests.checkpoints.hub_cache import place_snapshot, repository, stand_in_hub
from transformer_kit.checkpoints import hub
from transformer_kit.export.verify import relative_error

FIRST, SECOND = "a" * 40, "b" * 40  # the two snapshots' commits
IDS = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two random chat checkpoints (tokenizer, chat template, generation_config.json) and a
    GGUF file, as folders."""
    root = tmp_path_factory.mktemp("hub-sources")
    first = write_chat_checkpoint(root / "first", seed=0, layers=1)
    second = write_chat_checkpoint(root / "second", seed=1, layers=1)
    torch.manual_seed(0)
    qwen3 = hf.Qwen3ForCausalLM(hf.Qwen3Config(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_attention_heads=2,
        num_key_value_heads=1, num_hidden_layers=1, head_dim=16, max_position_embeddings=32,
        bos_token_id=1, eos_token_id=2))
    (root / "gguf").mkdir()
    gguf = write_gguf(qwen3, root / "gguf" / "tiny-F32.gguf", "qwen3")
    return first, second, gguf


@pytest.fixture
def cache(tmp_path, monkeypatch, checkpoints):
    """An offline Hub cache holding org/chat (main: the first checkpoint; tag v2: the second)
    and org/chat-GGUF (one file), named by HF_HUB_CACHE; the working directory is empty."""
    first, second, gguf = checkpoints
    cache = tmp_path / "hub-cache"
    place_snapshot(cache, "org/chat", first, FIRST)
    place_snapshot(cache, "org/chat", second, SECOND, refs=("v2",))
    place_snapshot(cache, "org/chat-GGUF", gguf, FIRST)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return cache


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS)


def test_a_hub_name_loads_its_cached_snapshot_as_the_folder_loads(cache, checkpoints):
    first, _, _ = checkpoints
    model = tk.from_hf("org/chat")
    folder = tk.from_hf(first)
    assert torch.equal(_logits(model), _logits(folder))
    reference = hf.AutoModelForCausalLM.from_pretrained(first).eval()
    with torch.no_grad():
        assert relative_error(_logits(model), reference(input_ids=IDS).logits) <= 1e-4
    assert model.tokenizer.files == folder.tokenizer.files  # tokenizer files and chat template
    assert tk.config_from_hf("org/chat") == tk.config_from_hf(first) == folder.config
    assert model.config.eos_id == folder.config.eos_id  # generation_config.json's end ids too


def test_a_revision_picks_another_snapshot(cache, checkpoints):
    first, second, _ = checkpoints
    expected = _logits(tk.from_hf(second))
    assert torch.equal(_logits(tk.from_hf("org/chat", revision="v2")), expected)
    assert torch.equal(_logits(tk.from_hf("org/chat", revision=SECOND)), expected)
    assert torch.equal(_logits(tk.from_hf("org/chat", revision="main")), _logits(tk.from_hf(first)))
    assert tk.config_from_hf("org/chat", revision="v2") == tk.config_from_hf(second)


def test_a_local_folder_of_the_same_name_wins(cache, checkpoints):
    _, second, _ = checkpoints
    shutil.copytree(second, "org/chat")  # relative to the working directory
    assert torch.equal(_logits(tk.from_hf("org/chat")), _logits(tk.from_hf(second)))
    with pytest.raises(tk.CheckpointError, match=r"revision='v2' picks a version of a Hub repository, "
                                                 r"but 'org/chat' is a local path"):
        tk.from_hf("org/chat", revision="v2")


def test_a_gguf_file_of_a_hub_repository(cache, checkpoints):
    _, _, gguf = checkpoints
    expected = _logits(tk.from_gguf(gguf))
    assert torch.equal(_logits(tk.from_gguf("org/chat-GGUF:tiny-F32.gguf")), expected)
    assert torch.equal(_logits(tk.from_gguf("org/chat-GGUF", gguf_file="tiny-F32.gguf")), expected)
    assert tk.config_from_gguf("org/chat-GGUF:tiny-F32.gguf", revision=FIRST) == tk.config_from_gguf(gguf)
    with pytest.raises(tk.CheckpointError, match=r"'org/chat-GGUF' is taken as a Hub repository; name "
                                                 r"its GGUF file: 'org/chat-GGUF:FILE.gguf'"):
        tk.from_gguf("org/chat-GGUF")
    with pytest.raises(tk.CheckpointError, match=r"has neither config.json nor modules.json.*"
                                                 r"org/name:FILE.gguf"):
        tk.from_hf("org/chat-GGUF")


def test_what_is_not_cached_offline_is_named_with_what_to_do(cache):
    with pytest.raises(tk.CheckpointError, match=r"Hub repository 'org/unknown' \(revision main\) is not "
                                                 r"a local path and not in the Hub cache .*hub-cache'.*"
                                                 r"HF_HUB_OFFLINE is set.*Unset HF_HUB_OFFLINE"):
        tk.from_hf("org/unknown")
    with pytest.raises(tk.CheckpointError, match=r"revision v9\) is not a local path and not in"):
        tk.config_from_hf("org/chat", revision="v9")
    with pytest.raises(tk.CheckpointError, match=r"file 'other.gguf' of Hub repository 'org/chat-GGUF' "
                                                 r"\(revision main\) is not a local path and not in the "
                                                 r"Hub cache"):
        tk.from_gguf("org/chat-GGUF:other.gguf")


def test_a_name_that_is_neither_a_path_nor_a_repository_id(cache):
    for name in ("org/chat/extra", "org name/chat", "./org/chat"):
        with pytest.raises(tk.CheckpointError, match=rf"'{name}' does not exist; give a Hugging Face "
                                                     r"checkpoint folder or a Hub repository id .* It is "
                                                     r"no local path, and not spelled as a Hub name"):
            tk.from_hf(name)
    with pytest.raises(tk.CheckpointError, match=r"'org/x--y:a.gguf' does not exist; give a GGUF file or "
                                                 r"a Hub name"):
        tk.from_gguf("org/x--y:a.gguf")


def test_the_hubs_refusals_are_sentences(online, monkeypatch):
    with stand_in_hub({"org/chat": (FIRST, {"config.json": b"{}"})}) as (address, _):
        monkeypatch.setenv("HF_ENDPOINT", address)
        with pytest.raises(tk.CheckpointError, match=r"'org/missing' is not a local path, and the Hub has "
                                                     r"no repository 'org/missing'.*HF_TOKEN"):
            tk.from_hf("org/missing")
        with pytest.raises(tk.CheckpointError, match=r"Hub repository 'org/gated' is gated: accept its "
                                                     r"conditions on https://huggingface.co/org/gated.*HF_TOKEN"):
            tk.from_hf("org/gated")
        with pytest.raises(tk.CheckpointError, match=r"Hub repository 'org/chat' has no revision 'nope'; "
                                                     r"give one of its branches, tags or commits"):
            tk.from_hf("org/chat", revision="nope")
        with pytest.raises(tk.CheckpointError, match=r"Hub repository 'org/chat' \(revision main\) has no "
                                                     r"file 'absent.gguf'"):
            tk.from_gguf("org/chat:absent.gguf")


def test_names_are_told_from_paths():
    assert hub.is_repo_id("Qwen/Qwen3-0.6B") and hub.is_repo_id("gpt2")
    for path in ("model.yaml", "a/b/c", "./x", "/abs/path", "x--y/z", "org/m.gguf", "org/x.json"):
        assert not hub.is_repo_id(path)
    assert hub.split_gguf_name("org/m-GGUF:m-Q4_K_M.gguf") == ("org/m-GGUF", "m-Q4_K_M.gguf")
    assert hub.split_gguf_name("org/m-GGUF:../x.gguf") is None and hub.split_gguf_name("org/m") is None


def test_a_sharded_checkpoint_and_a_sentence_transformers_repository(cache, checkpoints, tmp_path):
    pytest.importorskip("sentence_transformers")
    from tests.core.embedding.checkpoints import write_sentence_transformer

    first, _, _ = checkpoints
    sharded = tmp_path / "sharded"
    hf.AutoModelForCausalLM.from_pretrained(first).save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    place_snapshot(cache, "org/sharded", sharded, FIRST)
    assert torch.equal(_logits(tk.from_hf("org/sharded")), _logits(tk.from_hf(first)))
    reference = write_sentence_transformer(tmp_path / "st", dense=16, normalize=True)
    place_snapshot(cache, "org/st", tmp_path / "st", FIRST)  # 1_Pooling/, 2_Dense/, 3_Normalize/
    texts = ["a first text", "and another one"]
    vectors = tk.from_hf("org/st").embed(texts)
    assert vectors.shape == (2, 16)
    assert abs(vectors - reference.encode(texts)).max() <= 1e-5


@pytest.fixture
def online(cache, monkeypatch):
    """Downloads allowed (from the stand-in Hub the test starts, named by HF_ENDPOINT)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # read at its import
    return cache


def test_only_the_files_the_kit_reads_are_downloaded(online, checkpoints, tmp_path, monkeypatch):
    pytest.importorskip("sentence_transformers")
    from tests.core.embedding.checkpoints import write_sentence_transformer

    first, _, gguf = checkpoints
    unread = {"README.md": b"# a model", "consolidated.safetensors": b"x" * 64, "onnx/model.onnx": b"o",
              "onnx/config.json": b"{}", "tf_model.h5": b"h", "pytorch_model.bin": b"never read",
              "merges.txt": b"a b"}
    sharded = tmp_path / "sharded"
    hf.AutoModelForCausalLM.from_pretrained(first).save_pretrained(sharded, max_shard_size="100KB")
    legacy = tmp_path / "legacy"
    reference = hf.AutoModelForCausalLM.from_pretrained(first)
    reference.config.save_pretrained(legacy)
    torch.save(reference.state_dict(), legacy / "pytorch_model.bin")
    repos = {"org/fresh": ("c" * 40, repository(first, unread)),
             "org/sharded": ("d" * 40, repository(sharded, {"consolidated.safetensors": b"x"})),
             "org/legacy": ("e" * 40, repository(legacy, {"tf_model.h5": b"h"})),
             "org/fresh-GGUF": ("f" * 40, {"tiny-F32.gguf": gguf.read_bytes(), "tiny-Q8.gguf": b"GGUF"})}
    st = write_sentence_transformer(tmp_path / "st", dense=16, normalize=True)
    repos["org/st"] = ("a" * 40, repository(tmp_path / "st"))
    expected = _logits(tk.from_hf(first))
    with stand_in_hub(repos) as (address, fetched):
        monkeypatch.setenv("HF_ENDPOINT", address)
        tk.config_from_hf("org/fresh")  # the config and the tokenizer, no weights
        assert sorted(fetched) == ["chat_template.jinja", "config.json", "generation_config.json",
                                   "tokenizer.json", "tokenizer_config.json"]
        fetched.clear()
        assert torch.equal(_logits(tk.from_hf("org/fresh")), expected)
        assert fetched == ["model.safetensors"]
        fetched.clear()
        assert torch.equal(_logits(tk.from_hf("org/sharded")), expected)
        assert sorted(fetched) == sorted(repository(sharded))
        fetched.clear()
        assert torch.equal(_logits(tk.from_hf("org/legacy")), expected)
        assert sorted(fetched) == ["config.json", "pytorch_model.bin"]
        fetched.clear()
        assert torch.equal(_logits(tk.from_gguf("org/fresh-GGUF:tiny-F32.gguf")), _logits(tk.from_gguf(gguf)))
        assert fetched == ["tiny-F32.gguf"]
        fetched.clear()
        vectors = tk.from_hf("org/st").embed(["a text"])
        assert abs(vectors - st.encode(["a text"])).max() <= 1e-5
        assert set(repository(tmp_path / "st")) - set(fetched) == {"README.md"}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what was downloaded is in the cache
    assert torch.equal(_logits(tk.from_hf("org/fresh")), expected)
    assert torch.equal(_logits(tk.from_gguf("org/fresh-GGUF:tiny-F32.gguf")), _logits(tk.from_gguf(gguf)))
