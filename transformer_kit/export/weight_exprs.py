"""What the weight writer folds: expressions over a graph's weights; and the products it keeps
float: the output head (``Int4(head=False)``) and the routers of mixtures of experts.

An expression is a tuple: ``("weight", name)`` for a weight by state-dict name,
``("transpose", expr, perm)``, ``("concat", (expr, ...), axis)`` and ``("reshape", expr, shape)``
for the ONNX operations on weights alone in a built graph (a linear layer reads its matrix
transposed; the packed q/k/v and gate/up matrices are concatenations; a mixture of experts'
stacked experts are concatenations reshaped). The writer evaluates
them on one weight at a time and writes the result's bytes instead of the operation.
"""

from __future__ import annotations

import onnx_ir as ir

#: ("weight", name) | ("transpose", expr, perm) | ("concat", (expr, ...), axis)
#: | ("reshape", expr, shape)
Expr = tuple
#: Operations on weights alone that the writer does to the bytes instead of the runtime
#: (``Reshape``'s second input is a constant shape, not a weight).
FOLDED_OPS = ("Transpose", "Concat", "Identity", "Reshape")


def simplify(expr: Expr) -> Expr:
    """A transpose of a transpose of a matrix is the matrix."""
    if expr[0] == "transpose" and expr[1][0] == "transpose" and expr[2] == expr[1][2] == (1, 0):
        return expr[1][1]
    return expr


def fold(node: ir.Node, inputs: list[Expr], rank: int | None) -> Expr:
    """The expression ``node``'s output stands for, its weight inputs' being ``inputs`` (a
    ``Reshape``'s shape is read from its constant second input)."""
    if node.op_type == "Reshape":
        shape = node.inputs[1].const_value.numpy()
        return ("reshape", inputs[0], tuple(int(d) for d in shape))
    if node.op_type == "Identity":
        return inputs[0]
    if node.op_type == "Transpose":
        perm = node.attributes.get("perm")
        perm = tuple(perm.as_ints()) if perm is not None else tuple(reversed(range(rank or 2)))
        return simplify(("transpose", inputs[0], perm))
    return ("concat", tuple(inputs), node.attributes["axis"].as_int())


def _shared_length(lists: list[list[str]]) -> int:
    """How many leading items all of ``lists`` share."""
    length = 0
    while all(len(items) > length and items[length] == lists[0][length] for items in lists):
        length += 1
    return length


def name_of(expr: Expr) -> str:
    if expr[0] == "weight":
        return expr[1]
    if expr[0] == "transpose":
        return f"{name_of(expr[1])}.transposed"
    if expr[0] == "reshape":
        return f"{name_of(expr[1])}.reshaped"
    parts = [name_of(e).split(".") for e in expr[1]]  # a.b.q.weight, a.b.k.weight -> a.b.{q,k}.weight
    common = _shared_length(parts)
    tail = _shared_length([p[common:][::-1] for p in parts])
    middles = ",".join(".".join(p[common:len(p) - tail]) for p in parts)
    return ".".join([*parts[0][:common], "{" + middles + "}", *parts[0][len(parts[0]) - tail:]])


def head_matmuls(graph: ir.Graph, output: str = "logits") -> set[ir.Node]:
    """The MatMul nodes nearest to graph output ``output`` (the output head)."""
    outputs = [v for v in graph.outputs if v.name == output]
    found, seen, todo = set(), set(), list(outputs)
    while todo:
        node = todo.pop().producer()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node.op_type == "MatMul":
            found.add(node)
        else:
            todo.extend(v for v in node.inputs if v is not None)
    return found


#: The fused mixture-of-experts ops, whose input 1 is the router's logits.
EXPERT_OPS = ("MoE", "QMoE")
#: What lies between a router's product and the op: its bias, a sigmoid router's log-sigmoid.
_ROUTER_STEPS = ("Add", "Neg", "Softplus")


def router_matmuls(graph: ir.Graph) -> set[ir.Node]:
    """The MatMul nodes computing a mixture of experts' router logits (input 1 of a ``MoE`` or
    ``QMoE`` node, through a bias ``Add`` and a sigmoid router's ``-softplus(-l)``): kept
    float, as llama.cpp keeps ``ffn_gate_inp`` in its 4-bit files, since a coarser router picks
    other experts."""
    found = set()
    for node in graph:
        if node.op_type not in EXPERT_OPS or len(node.inputs) < 2 or node.inputs[1] is None:
            continue
        producer = node.inputs[1].producer()
        while producer is not None and producer.op_type in _ROUTER_STEPS:  # back to the product
            producer = next((v.producer() for v in producer.inputs
                             if v is not None and v.producer() is not None), None)
        if producer is not None and producer.op_type == "MatMul":
            found.add(producer)
    return found
