"""Repeating the last traced layer of a stack in an ONNX graph (see ``layer_stacks.py``).

:func:`extend_layers` finds the period from the weights' layer numbers and checks, node by node
over the last period, that it computes what the period before it computes: the same ops and
attributes, each input either the same value (or an equal constant), the previous period's value
one period on, or a weight, buffer or graph input whose name counts up by one layer. Then it
copies the period once per missing layer, with the layer's own weights, cache inputs and
outputs, and what came after the traced layers reads the last copy. Anything else (a node
reaching back two layers, the tail of the graph reading a layer's weights) returns ``False``
and the exporter traces all the layers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir


@dataclass(frozen=True)
class _Rule:
    """How one input of a node in the last period is found in the next period.

    kind: ``same`` (this very value), ``within`` (output ``index`` of node ``offset`` of the same
    period), ``previous`` (of the period before), ``next`` (a weight or graph input named with
    the layer number one up), ``none`` (an omitted optional input).
    """

    kind: str
    value: ir.Value | None = None
    offset: int = 0
    index: int = 0


def _next_name(before: str, after: str) -> tuple[list[str], int, int] | None:
    """When ``after`` is ``before`` with one number one larger: (parts, which part, number)."""
    a, b = re.split(r"(\d+)", before), re.split(r"(\d+)", after)
    if len(a) != len(b):
        return None
    differ = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    if len(differ) != 1 or differ[0] % 2 == 0 or int(b[differ[0]]) != int(a[differ[0]]) + 1:
        return None
    return b, differ[0], int(b[differ[0]])


def _renamed(named: tuple[list[str], int, int], steps: int) -> str:
    """The name ``steps`` layers after the one :func:`_next_name` read."""
    parts, where, number = named
    return "".join(str(number + steps) if i == where else p for i, p in enumerate(parts))


def _attributes_key(node: ir.Node) -> tuple | None:
    key = []
    for name, attr in sorted(node.attributes.items()):
        if attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
            return None
        value = attr.value
        if attr.type == ir.AttributeType.TENSOR:
            value = (value.dtype, tuple(value.shape), value.numpy().tobytes())
        elif isinstance(value, list):
            value = tuple(value)
        key.append((name, attr.type, value))
    return tuple(key)


def _node_key(node: ir.Node) -> tuple | None:
    attributes = _attributes_key(node)
    if attributes is None:
        return None
    return (node.domain, node.op_type, node.overload, len(node.inputs), len(node.outputs), attributes)


class _NotPeriodic(Exception):
    """The traced graph does not repeat as a stack of identical layers would."""


class _Period:
    """The analysis of a traced graph: where its last period is and how each input continues."""

    def __init__(self, graph: ir.Graph, stack: str, traced: int) -> None:
        self.graph = graph
        self.nodes = list(graph)
        self.position = {node: i for i, node in enumerate(self.nodes)}
        self.names: dict[ir.Value, tuple[list[str], int, int]] = {}  # values that count layers
        self.start = self.end = self.period = 0
        self.layer_name = re.compile(rf"(^|\.){re.escape(stack)}\.layers\.\d+\.")
        last, before = self._layer_uses(stack, traced - 1), self._layer_uses(stack, traced - 2)
        if not last or not before or last[0] <= before[0]:
            raise _NotPeriodic("the layers' weights are not read in order")
        period = last[0] - before[0]
        end = last[0]
        while end < len(self.nodes) and self._rules(end, period) is not None:
            end += 1
        if end - 2 * period < 0 or end - period > last[0]:
            raise _NotPeriodic("the last layer does not repeat the one before it")
        self.start, self.end, self.period = end - period, end, period
        self.template = self.nodes[self.start:self.end]
        self.names.clear()  # the search also read the node after the period
        self.rules = [self._rules(i, period) for i in range(self.start, self.end)]
        if any(r is None for r in self.rules):
            raise _NotPeriodic("a node of the last layer reaches back further than the layer before")
        if not all(self.start <= i < self.end for i in last):
            raise _NotPeriodic("the last layer's weights are read outside the repeating nodes")
        taken = set(graph.initializers) | {v.name for v in graph.inputs} | {v.name for v in graph.outputs}
        if any(_renamed(named, 1) in taken for named in self.names.values()):
            raise _NotPeriodic("a layer after the last traced one is in the graph already")
        self.layer_inputs = [v for v in graph.inputs if v in self.names]
        self.layer_outputs = self._layer_outputs()
        self._check_outside()

    def producer_index(self, value: ir.Value) -> int | None:
        node = value.producer()
        return None if node is None else self.position.get(node)

    def _layer_uses(self, stack: str, layer: int) -> list[int]:
        pattern = re.compile(rf"(^|\.){re.escape(stack)}\.layers\.{layer}\.")
        return [i for i, node in enumerate(self.nodes)
                if any(v is not None and v.name in self.graph.initializers and pattern.search(v.name)
                       for v in node.inputs)]

    def _rules(self, i: int, period: int) -> list[_Rule] | None:
        """How node ``i``'s inputs continue, when it repeats node ``i - period``; else None."""
        node, earlier = self.nodes[i], self.nodes[i - period]
        key = _node_key(node)
        if key is None or key != _node_key(earlier):
            return None
        rules = []
        for u, v in zip(earlier.inputs, node.inputs, strict=True):
            rule = self._rule(u, v, period)
            if rule is None:
                return None
            rules.append(rule)
        return rules

    def _rule(self, u: ir.Value | None, v: ir.Value | None, period: int) -> _Rule | None:
        if u is None or v is None:
            return _Rule("none") if u is None and v is None else None
        if u is v:
            return _Rule("same", v)
        pu, pv = self.producer_index(u), self.producer_index(v)
        if pu is not None and pv is not None:
            if pv != pu + period or u.index() != v.index():
                return None
            if not self.end:  # still looking for the period's end
                return _Rule("within")
            if pv >= self.start:
                return _Rule("within", offset=pv - self.start, index=v.index())
            if pv >= self.start - period:
                return _Rule("previous", offset=pv - (self.start - period), index=v.index())
            return None
        if pu is not None or pv is not None:
            return None
        if (u.const_value is not None and v.const_value is not None and u.dtype == v.dtype
                and np.array_equal(u.const_value.numpy(), v.const_value.numpy())):
            return _Rule("same", v)  # a constant every layer has
        named = _next_name(u.name or "", v.name or "")
        layer_state = v.name in self.graph.initializers and self.layer_name.search(v.name or "")
        if named is not None and (v in self.graph.inputs or layer_state):
            self.names[v] = named  # a cache input, or a weight or buffer of the layer
            return _Rule("next", v)
        return None

    def _layer_outputs(self) -> list[ir.Value]:
        """Graph outputs of the last period whose counterpart one period earlier is an output
        too, named one layer down (the caches); the others are the stack's final outputs."""
        outputs = []
        for v in self.graph.outputs:
            p = self.producer_index(v)
            if p is None or not self.start <= p < self.end:
                continue
            earlier = self.nodes[p - self.period].outputs[v.index()]
            if earlier in self.graph.outputs:
                named = _next_name(earlier.name or "", v.name or "")
                if named is None:
                    raise _NotPeriodic(f"graph output {v.name} does not count layers")
                self.names[v] = named
                outputs.append(v)
        return outputs

    def _check_outside(self) -> None:
        """Nothing outside the last period reads what its layer reads, and nothing after it
        reads the period before (the copies take the last period's place)."""
        for i, node in enumerate(self.nodes):
            if self.start <= i < self.end:
                continue
            for v in node.inputs:
                if v is None:
                    continue
                if v in self.names and not (node.op_type == "Shape" and v in self.graph.inputs):
                    # (a Shape of the last layer's cache reads a dimension every layer's shares)
                    raise _NotPeriodic(f"node {node.name} outside the period reads {v.name}")
                p = self.producer_index(v)
                if i >= self.end and p is not None and self.start - self.period <= p < self.start:
                    raise _NotPeriodic(f"node {node.name} reads the period before the last")


def extend_layers(model: ir.Model, stack: str, traced: int, total: int) -> bool:
    """Extend ``model``, traced with ``traced`` layers of ``stack``, to ``total`` layers in place.
    Returns ``False`` (and leaves ``model`` as it was) when the graph does not repeat."""
    graph = model.graph
    try:
        period = _Period(graph, stack, traced)
    except _NotPeriodic:
        return False
    current, inputs, outputs = period.template, period.layer_inputs, period.layer_outputs
    for step in range(1, total - traced + 1):
        created = _next_inputs(graph, period, inputs, step)
        copies: list[ir.Node] = []
        for node, rules in zip(period.template, period.rules, strict=True):
            copies.append(_copy(node, [_continued(r, copies, current, graph, period, step, created)
                                       for r in rules], step))
        graph.insert_after(current[-1], copies)
        outputs = _next_outputs(graph, period, outputs, copies, step)
        inputs = [created[_renamed(period.names[v], step)] for v in period.layer_inputs]
        current = copies
    _reroute_tail(graph, period, current)
    return True


def _copy(node: ir.Node, inputs: list[ir.Value | None], step: int) -> ir.Node:
    copy = ir.Node(node.domain, node.op_type, inputs, list(node.attributes.values()),
                   overload=node.overload, num_outputs=len(node.outputs), version=node.version,
                   name=f"{node.name}__{step}", metadata_props=dict(node.metadata_props))
    for original, out in zip(node.outputs, copy.outputs, strict=True):
        out.name = f"{original.name}__{step}"
        out.type = original.type
        out.shape = original.shape.copy() if original.shape is not None else None
    return copy


def _like(value: ir.Value, name: str) -> ir.Value:
    return ir.Value(name=name, type=value.type,
                    shape=value.shape.copy() if value.shape is not None else None)


def _next_inputs(graph: ir.Graph, period: _Period, previous: list[ir.Value],
                 step: int) -> dict[str, ir.Value]:
    """The layer's own graph inputs (its cache), placed after the layer before's."""
    created = {}
    if previous:
        where = max(graph.inputs.index(v) for v in previous) + 1
        for offset, template in enumerate(period.layer_inputs):
            value = _like(template, _renamed(period.names[template], step))
            graph.inputs.insert(where + offset, value)
            created[value.name] = value
    return created


def _next_outputs(graph: ir.Graph, period: _Period, previous: list[ir.Value],
                  copies: list[ir.Node], step: int) -> list[ir.Value]:
    """The layer's own graph outputs (its cache), named with its number, after the layer before's."""
    where = {node: i for i, node in enumerate(period.template)}
    outputs = []
    if previous:
        at = max(graph.outputs.index(v) for v in previous) + 1
        for offset, template in enumerate(period.layer_outputs):
            out = copies[where[template.producer()]].outputs[template.index()]
            out.name = _renamed(period.names[template], step)
            graph.outputs.insert(at + offset, out)
            outputs.append(out)
    return outputs


def _continued(rule: _Rule, copies: list[ir.Node], current: list[ir.Node], graph: ir.Graph,
               period: _Period, step: int, created: dict[str, ir.Value]) -> ir.Value | None:
    """The input that ``rule`` gives a node of the copy ``step`` layers after the last traced."""
    if rule.kind == "none":
        return None
    if rule.kind == "same":
        return rule.value
    if rule.kind == "within":
        return copies[rule.offset].outputs[rule.index]
    if rule.kind == "previous":
        return current[rule.offset].outputs[rule.index]
    name = _renamed(period.names[rule.value], step)
    if name not in created:  # a weight: the writer streams it by this name
        value = created[name] = _like(rule.value, name)
        value.const_value = ir.tensor(np.zeros(0, np.float32))  # onnx_ir registers only valued
        graph.register_initializer(value)
        value.const_value = None
    return created[name]


def _reroute_tail(graph: ir.Graph, period: _Period, last: list[ir.Node]) -> None:
    """What came after the traced layers reads the last copy instead of the last traced period."""
    where = {node: i for i, node in enumerate(period.template)}
    for node in period.nodes[period.end:]:
        for i, v in enumerate(node.inputs):
            if v is not None and v.producer() in where:
                node.replace_input_with(i, last[where[v.producer()]].outputs[v.index()])
    for i, v in enumerate(graph.outputs):
        if v.producer() in where and v not in period.names:
            out = last[where[v.producer()]].outputs[v.index()]
            name = v.name
            v.name, out.name = f"{name}__traced", name
            graph.outputs[i] = out
