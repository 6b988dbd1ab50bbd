"""bench/ort/quantize_int8.py IN.onnx OUT.onnx — dynamic int8 quantization of every MatMul with a constant [K, N] weight:
DynamicQuantizeLinear(x) -> MatMulInteger(x_q, W_q s8, x_zp) -> Cast -> Mul(x_scale * w_scale[N]),
weights symmetric per output channel (ORT fuses this into MatMulIntegerToFloat)."""
import sys
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

m = onnx.load(sys.argv[1])
g = m.graph
inits = {i.name: i for i in g.initializer}
alias = {n.output[0]: n.input[0] for n in g.node if n.op_type == "Identity" and n.input[0] in inits}
# constant transposes of weights (Linear exports as MatMul(x, Transpose(W)) or Gemm)
nodes, n_q = [], 0
for node in g.node:
    wname = alias.get(node.input[1], node.input[1]) if node.op_type in ("MatMul", "Gemm") else None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Gemm" and (attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0
                                   or attrs.get("beta", 1.0) != 1.0):
        wname = None
    if wname in inits and len(inits[wname].dims) == 2:
        W = numpy_helper.to_array(inits[wname]).astype(np.float32)  # [K, N]
        if node.op_type == "Gemm" and attrs.get("transB", 0):
            W = np.ascontiguousarray(W.T)
        s = np.abs(W).max(axis=0) / 127.0
        s[s == 0] = 1.0
        q = np.clip(np.rint(W / s), -127, 127).astype(np.int8)
        p = "q%d_" % n_q
        g.initializer.extend([numpy_helper.from_array(q, p + "w"),
                              numpy_helper.from_array(s.astype(np.float32), p + "ws"),
                              numpy_helper.from_array(np.zeros(W.shape[1], np.int8), p + "wz")])
        x = node.input[0]
        nodes += [
            helper.make_node("DynamicQuantizeLinear", [x], [p + "xq", p + "xs", p + "xz"]),
            helper.make_node("MatMulInteger", [p + "xq", p + "w", p + "xz", p + "wz"], [p + "acc"]),
            helper.make_node("Cast", [p + "acc"], [p + "accf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [p + "xs", p + "ws"], [p + "sc"]),
        ]
        if node.op_type == "Gemm" and len(node.input) > 2:
            nodes += [helper.make_node("Mul", [p + "accf", p + "sc"], [p + "y"]),
                      helper.make_node("Add", [p + "y", node.input[2]], [node.output[0]])]
        else:
            nodes.append(helper.make_node("Mul", [p + "accf", p + "sc"], [node.output[0]]))
        n_q += 1
    else:
        nodes.append(node)
del g.node[:]
g.node.extend(nodes)
used = {i for n in g.node for i in n.input}
keep = [i for i in g.initializer if i.name in used]
del g.initializer[:]
g.initializer.extend(keep)
onnx.save(m, sys.argv[2])
print("quantized %d MatMuls" % n_q)
