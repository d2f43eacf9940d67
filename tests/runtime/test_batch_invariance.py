"""A row computes the same numbers alone as in a batch: the int8 export quantizes each row's
activations with its own scale (``row_activations.py``), so its products, like float32's and
int4's ``MatMulNBits`` at accuracy level 4, are bit for bit those of the row alone; in both
batch-invariant cache layouts (left-padded with each row's cache columns keeping their
remainders modulo 16, ``left_padded.ALIGNMENT``; one buffer shared by past and present, each
row at its own first columns) a decoding row's logits at every step are those it gets alone,
bit for bit, whichever rows it shares the batch with and whenever it joins; greedy decoding of
prompts of different lengths gives the same tokens alone, in one batch and through the server
under 16 concurrent clients."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort
import openai
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.export import Int4, export_onnx
from transformer_kit.export.quantize import quantize_graph
from transformer_kit.runtime import Engine, OnnxModel
from transformer_kit.runtime.cache_layout import CacheLayout
from transformer_kit.runtime.left_padded import PREFILL_CHUNK, PaddedRows

VOCAB, NEW = 256, 12
KINDS = {"float32": None, "int8": "int8", "int4": Int4(), "int4-level-1": Int4(accuracy_level=1)}
LENGTHS = (3, 17, 5, 30, 9, 24, 1, 12)


def _exports(root, attention: str) -> dict[str, OnnxModel]:
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", vocab_size=VOCAB, d_model=128, d_ff=256, num_layers=3,
                                       pad_id=0, max_len=128, positional="rotary", norm="rmsnorm",
                                       attention=attention)).eval()
    layout = "left_padded" if attention == "matmul" else "shared_buffer"
    return {name: OnnxModel(export_onnx(model, root / name, quantize=q).path, providers="cpu",
                            cache_layout=layout) for name, q in KINDS.items()}


@pytest.fixture(scope="module")
def aligned_exports(tmp_path_factory):
    """The left-padded layout, aligned (the matmul kernel exports no shared step graph)."""
    return _exports(tmp_path_factory.mktemp("invariance"), "matmul")


@pytest.fixture(scope="module")
def shared_exports(tmp_path_factory):
    """One cache buffer shared by past and present (sdpa: GroupQueryAttention)."""
    return _exports(tmp_path_factory.mktemp("invariance-shared"), "sdpa")


@pytest.fixture(params=["aligned", "shared_buffer"])
def exports(request, aligned_exports, shared_exports):
    return aligned_exports if request.param == "aligned" else shared_exports


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(1)
    return [rng.integers(1, VOCAB, size=n).tolist() for n in LENGTHS]


def _matmul(tmp_path, opset: int) -> ort.InferenceSession:
    """One (rows, 64) x (64, 48) MatMul through the int8 export's quantizer."""
    w = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32) * 0.1
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", 48])],
                              [numpy_helper.from_array(w, "w")])
    path = tmp_path / "matmul.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10), path)
    quantize_graph(path, external=False)
    graph = onnx.load(path).graph
    assert "DynamicQuantizeLinear" not in {n.op_type for n in graph.node}
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    (matmul,) = (n for n in graph.node if n.op_type == "MatMulInteger")
    w_steps = weights[matmul.input[1]].astype(np.float64) - weights[matmul.input[3]]
    w_scale = next(v for k, v in weights.items() if k.endswith("_scale") and v.shape == (48,))
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), w, w_steps, w_scale


@pytest.mark.parametrize("opset", [17, 21], ids=["rounded", "blocked-quantize-linear"])
def test_int8_rows_are_quantized_alone_and_compute_their_exact_integer_product(tmp_path, opset):
    session, w, w_steps, w_scale = _matmul(tmp_path, opset)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    x[3] *= 100.0  # a row with large activations: a tensor-wide scale would coarsen the others
    batch = session.run(None, {"x": x})[0]
    for i in range(5):
        assert np.array_equal(session.run(None, {"x": x[i:i + 1]})[0][0], batch[i])
    # the reference: each row's symmetric int8 steps (max |x| / 127) times the quantizer's 7-bit
    # per-column weights; the integer product is exact, so only the float scaling rounds
    scale = np.abs(x).max(axis=1, keepdims=True) / np.float32(127.0)
    steps = np.round(x / scale)
    assert np.abs(steps).max() == 127 and np.abs(w_steps).max() <= 64
    reference = (steps.astype(np.float64) @ w_steps) * w_scale * scale
    assert np.abs(batch - reference).max() <= 1e-5 * np.abs(reference).max()
    assert np.abs(batch - x @ w).max() <= 0.02 * np.abs(x @ w).max()  # and near the float product


@pytest.mark.parametrize("kind", list(KINDS))
def test_rows_of_one_length_give_the_logits_they_give_alone_bit_for_bit(exports, kind):
    """7 tokens a row: products of 7 rows alone and 42 together (several rows both ways; a
    one-row product runs other kernels on AVX2 CPUs: docs/export.md, "Batch invariance")."""
    model = exports[kind]
    ids = np.random.default_rng(3).integers(1, VOCAB, size=(6, 7))
    batch = model(ids)
    for i in range(6):
        assert np.array_equal(model(ids[i:i + 1])[0], batch[i])


def _decode(batch: CacheLayout, prompts: list[list[int]], arrivals: list[int], steps: int
            ) -> list[list[np.ndarray]]:
    """Each prompt's next-token logits (vocab,) after its prompt and after each of ``steps``
    greedy tokens; prompt i is prefilled (alone: their lengths differ) at step ``arrivals[i]``
    and joins at the first step the batch may take it, as the engine's rows do."""
    logits: list[list[np.ndarray]] = [[] for _ in prompts]
    parked, active, step = [], [], 0
    while any(len(got) <= steps for got in logits):
        for i in (i for i, at in enumerate(arrivals) if at == step):
            rows, first = batch.prefill([np.array(prompts[i], np.int64)])
            logits[i].append(first[0].copy())
            parked.append((i, rows))
        while parked and batch.can_join:
            i, rows = parked.pop(0)
            batch.join(rows)
            active.append(i)
        if active:
            out = batch.step(np.array([int(logits[i][-1].argmax()) for i in active], np.int64))
            for row, i in enumerate(active):
                logits[i].append(out[row].copy())
            kept = [row for row, i in enumerate(active) if len(logits[i]) <= steps]
            if len(kept) < len(active):
                batch.keep(np.array(kept, np.int64))
                active = [active[row] for row in kept]
        step += 1
    return logits


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_decoding_row_gets_its_lone_logits_bit_for_bit_whenever_it_joins(exports, kind):
    """8 prompts of 1 to 30 tokens arriving at steps 0 to 21 (rows leaving as others come):
    every logit of every step equals the lone row's; without the alignment they do not (the
    padded attention sums in another order). Where one row's product runs another kernel than
    several rows' (accuracy level 1 on every CPU, int4 on AVX2 ones) a lone row's token runs as
    two copies (``one_row_exact`` decides, per model)."""
    prompts, arrivals = _prompts(), [0, 0, 3, 5, 6, 11, 17, 21]
    model = exports[kind]
    alone = [_decode(model.batch_decoder(), [p], [0], NEW)[0] for p in prompts]
    together = _decode(model.batch_decoder(), prompts, arrivals, NEW)
    for row, expected in zip(together, alone, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(row, expected, strict=True))
    if model.step_name == "decoder_step":  # left-padded without the alignment: other sums
        left_padded = OnnxModel(model.path, providers="cpu", batch_invariant=False,
                                cache_layout="left_padded")
        padded = _decode(left_padded.batch_decoder(), prompts, arrivals, NEW)
        lone = [_decode(left_padded.batch_decoder(), [p], [0], NEW)[0] for p in prompts]
        assert not all(np.array_equal(a, b) for row, expected in zip(padded, lone, strict=True)
                       for a, b in zip(row, expected, strict=True))


def test_one_row_exact_tells_which_exports_multiply_one_row_by_a_kernel_of_its_own(exports):
    """float32 and int8 multiply one row as several; int4 at accuracy level 1 does not
    (onnxruntime's ``SQ4BitGemmM1Kernel_CompFp32``), so its lone rows run as two copies."""
    one_token = np.arange(1, 3)[:, None]
    for kind, model in exports.items():
        apart = not np.array_equal(model(one_token[:1])[0], model(one_token)[0])
        assert model.batch_decoder().fewest_rows == (2 if apart else 1), kind
    assert exports["float32"].batch_decoder().fewest_rows == 1
    assert exports["int4-level-1"].batch_decoder().fewest_rows == 2


def test_a_mixture_of_experts_runs_its_lone_rows_and_prompts_whole(tmp_path):
    """A mixture's experts multiply one row otherwise than two (onnxruntime's MoE), and their
    products change with the rows routed to them in any batch, which copies of a lone row cannot
    match: its lone rows run as themselves, with no copies to pay for, and its prompts in one run
    (docs/export.md)."""
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", vocab_size=VOCAB, d_model=128, d_ff=256, num_layers=2,
                                       pad_id=0, max_len=128, positional="rotary", norm="rmsnorm",
                                       feedforward={"name": "moe", "num_experts": 8, "top_k": 2,
                                                    "expert_d_ff": 64})).eval()
    moe = OnnxModel(export_onnx(model, tmp_path / "moe").path, providers="cpu", cache_layout="left_padded")
    one_token = np.arange(1, 3)[:, None]
    assert not np.array_equal(moe(one_token[:1])[0], moe(one_token)[0])  # one row apart from two
    assert moe.batch_decoder().fewest_rows == 1
    # and its prompt runs whole (chunks would read the experts again for no exact hit): its
    # prefill gives the logits of the left-padded layout's one run, bit for bit
    prompt = np.random.default_rng(2).integers(1, VOCAB, 40)
    padded = OnnxModel(moe.path, providers="cpu", batch_invariant=False, cache_layout="left_padded")
    whole = [m.batch_decoder().prefill([prompt])[1] for m in (moe, padded)]
    assert np.array_equal(whole[0], whole[1]) and moe.batch_decoder().prefill_chunk == 1


@pytest.mark.parametrize("kind", list(KINDS))
def test_greedy_tokens_alone_equal_those_in_a_batch_and_through_the_server(exports, kind):
    """Prompts of 1 to 30 tokens: ``generate`` of all of them in one call, and 16 concurrent
    clients of the server, give each the greedy tokens it gets alone."""
    model = exports[kind]
    prompts = _prompts()
    alone = [model.generate(np.array([p]), max_new_tokens=NEW, do_sample=False)[0].tolist()
             for p in prompts]
    width = max(LENGTHS)
    ids = np.zeros((len(prompts), width), np.int64)
    mask = np.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], mask[i, width - len(p):] = p, 1
    assert model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False).tolist() == alone

    eos = model.manifest.eos_id
    expected = [row[:row.index(eos) + 1] if eos in row else row for row in alone]
    engine = Engine(model, max_batch=16, max_queue=64)
    try:
        with running(create_app(engine, "tiny")) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)

            def ask(i: int) -> list[int]:
                choice = client.completions.create(model="tiny", prompt=prompts[i % 8], max_tokens=NEW,
                                                   temperature=0).choices[0]
                return choice.model_extra["token_ids"]

            with ThreadPoolExecutor(16) as pool:
                answers = list(pool.map(ask, range(16)))
    finally:
        engine.close()
    assert answers == [expected[i % 8] for i in range(16)]


def _cache_arrays(rows) -> list[np.ndarray]:
    """Prefilled rows' cache as arrays: the mask and each value (left-padded), or each row's
    length and its columns of each buffer (a shared buffer)."""
    if isinstance(rows, PaddedRows):
        return [rows.mask, *(value.numpy() for value in rows.cache)]
    return [rows.lengths, *(b[:, :, :int(rows.lengths.max())] for b in rows.buffers)]


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_prompt_continuing_cached_chunks_computes_what_it_computes_from_scratch(exports, kind):
    """A prompt continuing another prompt's cached prefix (a prefix cache's hit) gets the
    logits and the cache of its prefill from scratch, bit for bit: in the aligned layout a
    prompt is prefilled in chunks of 16 tokens (``left_padded.PREFILL_CHUNK``) and the hit
    reuses whole chunks; in the shared buffer a prompt runs whole and a hit leaves at least
    ``prefix_room`` tokens to compute."""
    decoder = exports[kind].batch_decoder()
    rng = np.random.default_rng(5)
    prefix = rng.integers(1, VOCAB, 70)
    first, second = (np.concatenate([prefix, rng.integers(1, VOCAB, n)]) for n in (6, 9))
    cached, _ = decoder.prefill([first])
    entry, _ = decoder.prefix_entry(cached, 0)
    # 64 of the 70 shared tokens; all 70 that a hit may reuse; the first prompt asked again
    most = len(first) - decoder.prefix_room
    cases = {(4 * PREFILL_CHUNK, 1), (70 - 70 % decoder.prefill_chunk, 1),
             (most - most % decoder.prefill_chunk, 0)}
    for reused, which in sorted(cases):
        prompt = (first, second)[which]
        past = decoder.prefix_past(entry, 1, reused)
        continued, logits = decoder.prefill([prompt[reused:]], past, reused)
        whole, expected = decoder.prefill([prompt])
        assert np.array_equal(logits, expected), reused
        for mine, theirs in zip(_cache_arrays(continued), _cache_arrays(whole), strict=True):
            assert np.array_equal(mine, theirs), reused
