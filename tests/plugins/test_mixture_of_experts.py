"""The ``moe`` feed-forward against a dense reference (every expert on every token, its output
weighted by the router's weight where the token chose it and zero elsewhere); its routers'
formulas; the experts that run; its options' refusals; its export (onnxruntime's fused MoE op, one
node per layer) and the configurations that op cannot express."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
import torch

import transformer_kit as tk
from transformer_kit.export import Int4, export_onnx
from transformer_kit.export.verify import relative_error
from transformer_kit.plugins.mixture_of_experts import MixtureOfExperts
from transformer_kit.runtime import OnnxModel

D_MODEL = 12
#: gpt-oss's experts (its limit 7 lowered so the clamp acts on these small random inputs).
CLAMPED = {"name": "swiglu", "bias": True, "alpha": 1.702, "limit": 1.0, "up_offset": 1.0}


def _moe(**params) -> MixtureOfExperts:
    context = {"d_model": D_MODEL, "d_ff": 20, "dropout": 0.0}
    params = {"num_experts": 5, "top_k": 2, **params}
    return tk.get_registry().create("feedforward", "moe", context=context, **params).eval()


def _randomised(moe: MixtureOfExperts) -> MixtureOfExperts:
    """Router weights large enough that the experts' scores spread (and a nonzero bias)."""
    with torch.no_grad():
        moe.router.weight.normal_(std=1.0)
        if moe.router.bias is not None:
            moe.router.bias.normal_(std=1.0)
    return moe


def _router_weights(moe: MixtureOfExperts, x: torch.Tensor) -> torch.Tensor:
    """(tokens, num_experts): each token's weight on each expert, by the routers' formulas
    written out (zero where the token did not choose the expert)."""
    logits = x @ moe.router.weight.T + (0 if moe.router.bias is None else moe.router.bias)
    scores = torch.sigmoid(logits) if moe.routing == "sigmoid" else torch.softmax(logits, dim=-1)
    kept = scores >= scores.topk(moe.top_k, dim=-1).values[:, -1:]  # the top-k (no ties here)
    weights = torch.where(kept, scores, 0.0)
    if moe.routing == "softmax_topk":  # a softmax over the k logits kept
        weights = torch.where(kept, torch.softmax(logits.masked_fill(~kept, -torch.inf), dim=-1), 0.0)
    elif moe.normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights


def _dense(moe: MixtureOfExperts, x: torch.Tensor) -> torch.Tensor:
    """x (batch, len, d_model) -> the same: every expert on every token, weights masked."""
    flat = x.reshape(-1, x.shape[-1])
    weights = _router_weights(moe, flat)  # (tokens, num_experts)
    outputs = torch.stack([expert(flat) for expert in moe.experts], dim=1)  # (tokens, E, d_model)
    out = (weights[..., None] * outputs).sum(dim=1)
    if moe.shared_expert is not None:
        out = out + torch.sigmoid(flat @ moe.shared_expert_gate.weight.T) * moe.shared_expert(flat)
    return out.reshape(x.shape)


@pytest.mark.parametrize("params", [
    {"top_k": 1},
    {"top_k": 2},
    {"top_k": 2, "normalize": True},
    {"top_k": 3, "router": "softmax_topk", "router_bias": True},
    {"top_k": 1, "router": "softmax_topk"},
    {"top_k": 2, "router": "sigmoid"},
    {"top_k": 2, "router": "sigmoid", "normalize": True, "router_bias": True},
    {"top_k": 2, "shared_expert_d_ff": 7},
    {"top_k": 5, "normalize": True, "shared_expert_d_ff": 4, "expert_d_ff": 3},
    {"top_k": 2, "expert": "geglu", "expert_d_ff": 6},
    {"top_k": 2, "router": "softmax_topk", "router_bias": True, "expert": CLAMPED},
], ids=str)
def test_equals_the_dense_reference(params):
    torch.manual_seed(0)
    moe = _randomised(_moe(**params))
    x = torch.randn(3, 7, D_MODEL)
    with torch.no_grad():
        torch.testing.assert_close(moe(x), _dense(moe, x), rtol=1e-5, atol=1e-6)


def test_softmax_renormalised_and_softmax_topk_are_the_same_weights():
    torch.manual_seed(1)
    first = _randomised(_moe(top_k=3, normalize=True))
    second = _moe(top_k=3, router="softmax_topk")
    second.load_state_dict(first.state_dict())
    x = torch.randn(20, D_MODEL)
    with torch.no_grad():
        (w1, e1), (w2, e2) = first.route(x), second.route(x)
    assert torch.equal(e1, e2)
    torch.testing.assert_close(w1, w2)


def test_each_expert_runs_once_on_just_the_tokens_that_chose_it():
    torch.manual_seed(2)
    moe = _randomised(_moe(num_experts=6, top_k=2))
    with torch.no_grad():
        moe.router.weight[5] = -10.0  # with positive inputs, expert 5 is chosen by no token
    seen: dict[int, list[int]] = {}
    for e, expert in enumerate(moe.experts):
        expert.register_forward_hook(lambda _m, inputs, _o, e=e: seen.setdefault(e, []).append(
            inputs[0].shape[0]))
    x = torch.randn(2, 9, D_MODEL).abs()
    with torch.no_grad():
        _, chosen = moe.route(x.reshape(-1, D_MODEL))
        moe(x)
    counts = torch.bincount(chosen.flatten(), minlength=6).tolist()
    assert counts[5] == 0 and 5 not in seen  # an expert no token chose never runs
    assert seen == {e: [n] for e, n in enumerate(counts) if n}  # each once, on its tokens only


def test_one_token_and_an_expert_without_tokens_still_give_the_reference():
    torch.manual_seed(3)
    moe = _randomised(_moe(num_experts=4, top_k=1, shared_expert_d_ff=5))
    x = torch.randn(1, 1, D_MODEL)
    with torch.no_grad():
        torch.testing.assert_close(moe(x), _dense(moe, x), rtol=1e-5, atol=1e-6)


def test_in_a_model_padded_rows_and_cached_steps_give_the_uncached_logits():
    torch.manual_seed(4)
    model = tk.build_model({"architecture": "decoder", "vocab_size": 40, "d_model": 16,
                            "num_heads": 2, "num_layers": 2, "d_ff": 24, "dropout": 0.0,
                            "feedforward": {"name": "moe", "num_experts": 4, "top_k": 2}}).eval()
    ids = torch.randint(3, 40, (2, 8))
    ids[1, 5:] = 0
    mask = (ids != 0).long()
    tokens = model.generate(ids, max_new_tokens=5, attention_mask=mask)
    uncached = model.generate(ids, max_new_tokens=5, attention_mask=mask, use_cache=False)
    assert torch.equal(tokens, uncached)


@pytest.mark.parametrize(("params", "message"), [
    ({"num_experts": 0}, r"num_experts must be an integer >= 1 \(the routed experts\); got 0"),
    ({"num_experts": 2.0}, r"num_experts must be an integer >= 1 .*got 2.0"),
    ({"top_k": True}, r"top_k must be an integer >= 1 .*got True"),
    ({"num_experts": 2, "top_k": 3}, r"top_k \(3\) must not exceed num_experts \(2\).*Lower top_k"),
    ({"expert": "relu"}, r"expert must name a registered gated feed-forward .*got 'relu'. "
                         r"Gated feed-forwards: geglu, swiglu"),
    ({"expert_d_ff": 0}, r"expert_d_ff must be an integer >= 1"),
    ({"router": "softmax_top_k"}, r"router must be one of softmax, softmax_topk, sigmoid; "
                                  r"got 'softmax_top_k'"),
    ({"normalize": "yes"}, r"normalize must be true or false .*got 'yes'"),
    ({"shared_expert_d_ff": -1}, r"shared_expert_d_ff must be an integer >= 0 .*0: none"),
    ({"router_bias": 1}, r"router_bias must be true or false"),
    ({"topk": 4}, r"got unknown parameter 'topk'. Did you mean 'top_k'"),
    ({"expert": {"bias": True}}, r"expert must name a registered gated feed-forward .*alone or as"),
    ({"expert": {"name": "swiglu", "limit": -1}}, r"expert: feedforward 'swiglu' .*limit must be positive"),
], ids=str)
def test_bad_options_are_refused_with_a_sentence_naming_the_slot(params, message):
    config = {"architecture": "decoder", "vocab_size": 40, "d_model": 16, "num_heads": 2,
              "num_layers": 1, "d_ff": 24,
              "feedforward": {"name": "moe", "num_experts": 4, "top_k": 2, **params}}
    with pytest.raises(tk.ConfigError, match=r"decoder layer 0\.feedforward: feedforward 'moe'") as caught:
        tk.build_model(config)
    assert caught.match(message)


def _moe_model(num_experts: int = 4, **params) -> tk.TransformerModel:
    torch.manual_seed(5)
    model = tk.build_model({"architecture": "decoder", "vocab_size": 40, "d_model": 16,
                            "num_heads": 2, "num_layers": 2, "d_ff": 24, "dropout": 0.0,
                            "feedforward": {"name": "moe", "num_experts": num_experts,
                                            "top_k": 2, **params}}).eval()
    for layer in model.decoder.layers:
        _randomised(layer.feedforward)
    return model


def _op_types(folder) -> Counter:
    return Counter(n.op_type for n in onnx.load(folder / "model.onnx", load_external_data=False).graph.node)


@pytest.mark.parametrize("params", [
    {"top_k": 1},
    {"top_k": 2, "normalize": True},
    {"top_k": 3, "router": "softmax_topk", "router_bias": True},
    {"top_k": 2, "shared_expert_d_ff": 7, "expert_d_ff": 6},
    {"top_k": 4, "normalize": True, "shared_expert_d_ff": 4, "router_bias": True},
    {"top_k": 2, "router": "softmax_topk", "router_bias": True, "expert": CLAMPED},
    {"top_k": 1, "expert": {"name": "swiglu", "bias": True}},
    {"top_k": 2, "router": "sigmoid", "normalize": True, "router_bias": True},  # as log(sigmoid)
], ids=str)
def test_export_is_one_moe_node_per_layer_and_equals_pytorch(params, tmp_path):
    model = _moe_model(**params)
    report = export_onnx(model, tmp_path / "onnx")  # verified against PyTorch
    assert report.max_error <= 1e-4
    ops = _op_types(tmp_path / "onnx")
    assert ops["MoE"] == 2
    ids = torch.randint(3, 40, (2, 9))
    ids[1, 6:] = 0
    mask = (ids != 0).long()
    om = OnnxModel(tmp_path / "onnx", providers="cpu")
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).numpy()
    ours = om(ids.numpy(), attention_mask=mask.numpy())
    real = mask.numpy().astype(bool)
    assert relative_error(ours[real], expected[real]) <= 1e-4
    tokens = model.generate(ids, max_new_tokens=6, attention_mask=mask).numpy()
    np.testing.assert_array_equal(om.generate(ids.numpy(), max_new_tokens=6, attention_mask=mask.numpy()),
                                  tokens)


def test_clamped_experts_with_biases_export_with_the_op_s_biases_and_attributes(tmp_path):
    """gpt-oss's experts: fc1 bias (E, 2 x d_ff) interleaved like fc1's rows, fc2 bias (E,
    d_model), activation_alpha / activation_beta / swiglu_limit; the clamp acts."""
    model = _moe_model(top_k=2, router="softmax_topk", router_bias=True, expert=CLAMPED)
    with torch.no_grad():
        for layer in model.decoder.layers:
            for expert in layer.feedforward.experts:
                for linear in (expert.gate, expert.up, expert.down):
                    linear.bias.normal_()
    export_onnx(model, tmp_path / "onnx")  # verified against PyTorch
    graph = onnx.load(tmp_path / "onnx" / "model.onnx", load_external_data=False).graph
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    for node in (n for n in graph.node if n.op_type == "MoE"):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attributes["activation_alpha"] == pytest.approx(1.702)
        assert attributes["activation_beta"] == 1.0 and attributes["swiglu_limit"] == 1.0
        assert shapes[node.input[3]] == [4, 48] and shapes[node.input[5]] == [4, 16]


def test_an_encoder_decoder_with_experts_exports(tmp_path):
    """The encoder's and the decoder's token counts differ: the router's input names neither
    (one shared name made onnxruntime reuse one buffer for both: "Shape mismatch")."""
    torch.manual_seed(7)
    model = tk.build_model({"architecture": "encoder_decoder", "src_vocab_size": 20, "tgt_vocab_size": 20,
                            "d_model": 8, "num_heads": 2, "num_layers": 1, "d_ff": 8, "dropout": 0.0,
                            "feedforward": {"name": "moe", "num_experts": 2, "top_k": 1}}).eval()
    assert export_onnx(model, tmp_path / "onnx").max_error <= 1e-4  # verified at two lengths


def test_the_graph_does_not_grow_with_the_experts(tmp_path):
    """The experts are the MoE node's stacked weights: twice the experts, the same nodes."""
    export_onnx(_moe_model(num_experts=4), tmp_path / "four")
    export_onnx(_moe_model(num_experts=8), tmp_path / "eight")
    assert _op_types(tmp_path / "four") == _op_types(tmp_path / "eight")


@pytest.mark.parametrize(("quantize", "expert_d_ff", "op", "bits"), [
    ("int8", 32, "QMoE", (8, 8)),
    (Int4(block_size=16), 32, "QMoE", (8, 4)),  # eight_bit's "early": the first layer in 8 bits
    (Int4(block_size=16, eight_bit=()), 32, "QMoE", (4, 4)),
    ("int8", 24, "QMoE", (8, 8)),  # a scale per row: no block of 16 divides 24
    (Int4(eight_bit=()), 24, "MoE", None),  # 4 bits need blocks: the experts stay float
])
def test_quantized_exports_quantize_the_experts_as_qmoe_and_verify(quantize, expert_d_ff, op, bits, tmp_path):
    """int8 and int4 exports write each layer's experts as one QMoE node (shared expert beside
    it, quantized as any product); 4-bit experts whose widths no block divides stay float."""
    model = _moe_model(shared_expert_d_ff=8, normalize=True, expert_d_ff=expert_d_ff)
    report = export_onnx(model, tmp_path / "onnx", quantize=quantize)  # within int8's / int4's tolerance
    ops = _op_types(tmp_path / "onnx")
    assert ops[op] == 2 and ops["MoE" if op == "QMoE" else "QMoE"] == 0
    graph = onnx.load(tmp_path / "onnx" / "model.onnx", load_external_data=False).graph
    stacked = {t.name: t.data_type for t in graph.initializer if ".experts." in t.name}
    if bits is None:
        assert len(stacked) == 4 and set(stacked.values()) == {onnx.TensorProto.FLOAT}
    else:
        nodes = [n for n in graph.node if n.op_type == "QMoE"]
        for node, layer_bits in zip(nodes, bits, strict=True):
            attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert attributes["expert_weight_bits"] == layer_bits
            assert {stacked[node.input[2]], stacked[node.input[5]]} == {onnx.TensorProto.UINT8}
    assert 0 < report.max_error < 0.5 and report.top1_agreement > 0.5


def test_softmax_topk_exports_as_normalized_softmax(tmp_path):
    export_onnx(_moe_model(top_k=3, router="softmax_topk"), tmp_path / "onnx")
    graph = onnx.load(tmp_path / "onnx" / "model.onnx", load_external_data=False).graph
    for node in (n for n in graph.node if n.op_type == "MoE"):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attributes["normalize_routing_weights"] == 1 and attributes["k"] == 3


@pytest.mark.parametrize(("params", "reason"), [
    ({"router": "sigmoid"}, r"router 'sigmoid' and normalize false is not exported to ONNX: the MoE "
                            r"op mixes the experts by a softmax of its router input"),
    ({"expert": "geglu"}, r"experts are GeGLU is not exported to ONNX: the MoE op's gated activation "
                          r"is SwiGLU only"),
], ids=str)
def test_configurations_the_moe_op_cannot_express_refuse_export_with_the_reason(params, reason, tmp_path):
    model = _moe_model(**params)
    with pytest.raises(tk.ExportError, match=r"feedforward 'moe' \(plugin 'builtin'\) declares itself "
                                             r"not exportable. ") as caught:
        export_onnx(model, tmp_path / "onnx")
    assert caught.match(reason) and caught.match("use this model in PyTorch")
    assert not (tmp_path / "onnx").exists()
    assert model.unexportable == ["feedforward 'moe' (plugin 'builtin')"]
