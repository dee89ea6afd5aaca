"""One BERT-base encoder layer (post-LayerNorm, GELU) built with the Network API, random weights
(BERT's N(0, 0.02) init): Q/K/V projections, per-head scores with 1/sqrt(d) scaling, softmax, context,
output projection, residual + LayerNorm (Reduce-based), FFN with GELU, residual + LayerNorm. ``spec``
holds the weights; the GPU benchmark copies them into the same block in PyTorch."""
from __future__ import annotations

import numpy as np

from tftrt_py.engine import Network

EPS = 1e-12


def spec(hidden: int = 768, heads: int = 12, ffn: int = 3072, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def b(n):
        return (rng.standard_normal(n) * 0.02).astype(np.float32)

    return {"hidden": hidden, "heads": heads, "ffn": ffn,
            "q": (w(hidden, hidden), b(hidden)), "k": (w(hidden, hidden), b(hidden)),
            "v": (w(hidden, hidden), b(hidden)), "o": (w(hidden, hidden), b(hidden)),
            "ln1": (1 + b(hidden), b(hidden)), "ffn1": (w(hidden, ffn), b(ffn)), "ffn2": (w(ffn, hidden), b(hidden)),
            "ln2": (1 + b(hidden), b(hidden))}


def network(batch: int, seq: int = 128, model: dict = None, dtype: str = "float16",
            name: str = "bert_layer", layers: int = 1) -> Network:
    """x [batch, seq, hidden] (`dtype`) -> y [batch, seq, hidden]; `layers` > 1: that many layers in a stack, each
    with the same weights (its layers' names prefixed "l<i>.")."""
    m = model or spec()
    hidden, heads = m["hidden"], m["heads"]
    dh = hidden // heads
    net = Network(name)
    x = net.add_input("x", dtype, (batch, seq, hidden))
    rows = net.add_layer("Shuffle", [x], {"reshape": [batch * seq, hidden]}, name="rows").outputs[0]

    def block(rows, p):
        def linear(t, key, activation=None):
            w, b = m[key]
            params = {"activation": activation} if activation else {}
            return net.add_layer("MatrixMultiply", [t, net.add_constant(w.astype(dtype), name=f"{p}{key}.w")], params,
                                 {"bias": b}, name=f"{p}{key}").outputs[0]

        def heads_of(t, key):
            return net.add_layer("Shuffle", [t], {"reshape": [batch, seq, heads, dh], "second_perm": [0, 2, 1, 3]},
                                 name=f"{p}{key}.heads").outputs[0]

        def layer_norm(t, key):
            gamma, beta = m[key]
            mean = net.add_layer("Reduce", [t], {"op": "mean", "axes": [1], "keep_dims": True}, name=f"{p}{key}.mean")
            d = net.add_layer("ElementWise", [t, mean.outputs[0]], {"op": "sub"}, name=f"{p}{key}.center").outputs[0]
            sq = net.add_layer("ElementWise", [d, d], {"op": "prod"}, name=f"{p}{key}.square").outputs[0]
            var = net.add_layer("Reduce", [sq], {"op": "mean", "axes": [1], "keep_dims": True}, name=f"{p}{key}.var")
            eps = net.add_constant(np.full((1, 1), EPS, dtype), name=f"{p}{key}.eps")
            r = net.add_layer("ElementWise", [var.outputs[0], eps], {"op": "sum"}, name=f"{p}{key}.var_eps").outputs[0]
            r = net.add_layer("Unary", [r], {"op": "rsqrt"}, name=f"{p}{key}.rsqrt").outputs[0]
            n = net.add_layer("ElementWise", [d, r], {"op": "prod"}, name=f"{p}{key}.normalize").outputs[0]
            return net.add_layer("Scale", [n], {"channel_axis": -1}, {"scale": gamma, "shift": beta},
                                 name=f"{p}{key}.affine").outputs[0]

        q, k, v = (heads_of(linear(rows, key), key) for key in ("q", "k", "v"))
        scores = net.add_layer("MatrixMultiply", [q, k], {"transpose_b": True}, name=f"{p}scores").outputs[0]
        scores = net.add_layer("Scale", [scores], {}, {"scale": np.array([1.0 / np.sqrt(dh)], np.float32)},
                               name=f"{p}scores.scale").outputs[0]
        probs = net.add_layer("Softmax", [scores], {"axis": -1}, name=f"{p}softmax").outputs[0]
        ctx = net.add_layer("MatrixMultiply", [probs, v], {}, name=f"{p}context").outputs[0]
        ctx = net.add_layer("Shuffle", [ctx], {"first_perm": [0, 2, 1, 3], "reshape": [batch * seq, hidden]},
                            name=f"{p}context.rows").outputs[0]
        h = net.add_layer("ElementWise", [linear(ctx, "o"), rows], {"op": "sum"},
                          name=f"{p}attention.residual").outputs[0]
        h = layer_norm(h, "ln1")
        f = linear(linear(h, "ffn1", {"type": "gelu_erf"}), "ffn2")
        return layer_norm(net.add_layer("ElementWise", [f, h], {"op": "sum"}, name=f"{p}ffn.residual").outputs[0],
                          "ln2")

    for i in range(layers):
        rows = block(rows, f"l{i}." if layers > 1 else "")
    y = net.add_layer("Shuffle", [rows], {"reshape": [batch, seq, hidden]}, name="unrows").outputs[0]
    net.mark_output(y, name="y")
    return net


def flops(batch: int, seq: int = 128, model: dict = None, layers: int = 1) -> float:
    """Multiply-adds x 2 of the projections, the FFN and attention."""
    m = model or spec()
    h, f = m["hidden"], m["ffn"]
    per_token = 2 * (4 * h * h + 2 * h * f) + 2 * 2 * seq * h
    return float(per_token * seq * batch * layers)


def torch_block(model, torch, gelu: str = "none", layers: int = 1):
    """The same layer in PyTorch (fp32 parameters; call .half() for fp16), attention through SDPA; `gelu`:
    F.gelu's approximate ("tanh": the form our fp16 engines fuse into the GEMM); `layers` > 1: a stack of that
    block."""
    nn, F = torch.nn, torch.nn.functional
    hidden, heads = model["hidden"], model["heads"]

    def linear(key):
        w, b = model[key]
        lin = nn.Linear(w.shape[0], w.shape[1])
        lin.weight.data = torch.from_numpy(np.ascontiguousarray(w.T))
        lin.bias.data = torch.from_numpy(b)
        return lin

    def norm(key):
        ln = nn.LayerNorm(hidden, eps=EPS)
        ln.weight.data = torch.from_numpy(model[key][0].copy())
        ln.bias.data = torch.from_numpy(model[key][1].copy())
        return ln

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (linear(k) for k in ("q", "k", "v", "o"))
            self.ffn1, self.ffn2 = linear("ffn1"), linear("ffn2")
            self.ln1, self.ln2 = norm("ln1"), norm("ln2")

        def forward(self, x):
            b, s, _ = x.shape

            def split(t):
                return t.view(b, s, heads, hidden // heads).transpose(1, 2)

            ctx = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
            h = self.ln1(x + self.o(ctx.transpose(1, 2).reshape(b, s, hidden)))
            return self.ln2(h + self.ffn2(F.gelu(self.ffn1(h), approximate=gelu)))

    block = Block()
    return block if layers == 1 else nn.Sequential(*[block] * layers)
