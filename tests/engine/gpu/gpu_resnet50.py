"""ResNet-50 v1.5 built directly with the Network API: batch norm folded into each convolution
(random weights, He-scaled so activations stay O(1)), ReLU and the residual sum fused into the
convolutions, max pool, global mean, a fully connected layer. ``spec`` describes the same model for
other frameworks (the GPU benchmark copies it into PyTorch)."""
from __future__ import annotations

import numpy as np

from tftrt_py.engine import Network

STAGES = ((3, 64), (4, 128), (6, 256), (3, 512))


def _conv(rng, name, cin, cout, k, stride, pad, relu, last=False) -> dict:
    w = rng.standard_normal((k, k, cin, cout)).astype(np.float32) * np.float32(np.sqrt(2.0 / (k * k * cin)))
    scale = rng.uniform(0.1, 0.3, cout) if last else rng.uniform(0.7, 1.0, cout)  # folded BN gamma/sigma
    return {"name": name, "kernel": (w * scale.astype(np.float32)).astype(np.float32),
            "bias": (rng.standard_normal(cout) * 0.05).astype(np.float32), "stride": stride, "pad": pad, "relu": relu}


def spec(classes: int = 1000, seed: int = 0, stages=STAGES) -> dict:
    """Weights and structure: stem, blocks [(conv1, conv2, conv3, projection or None)], fc."""
    rng = np.random.default_rng(seed)
    stem = _conv(rng, "conv1", 3, 64, 7, 2, 3, True)
    blocks, cin = [], 64
    for s, (n, width) in enumerate(stages):
        for b in range(n):
            stride = 2 if (b == 0 and s > 0) else 1
            name = f"layer{s + 1}.{b}"
            proj = _conv(rng, f"{name}.downsample", cin, width * 4, 1, stride, 0, False, last=True) if b == 0 else None
            blocks.append((_conv(rng, f"{name}.conv1", cin, width, 1, 1, 0, True),
                           _conv(rng, f"{name}.conv2", width, width, 3, stride, 1, True),
                           _conv(rng, f"{name}.conv3", width, width * 4, 1, 1, 0, True, last=True), proj))
            cin = width * 4
    fc_w = (rng.standard_normal((cin, classes)) / np.sqrt(cin)).astype(np.float32)
    fc_b = (rng.standard_normal(classes) * 0.01).astype(np.float32)
    return {"stem": stem, "blocks": blocks, "fc": (fc_w, fc_b), "classes": classes}


def network(batch: int = 1, size: int = 224, model: dict = None, name: str = "resnet50") -> Network:
    """The ResNet-50 Network for inputs [batch, size, size, 3] (NHWC, float32) -> logits [batch, classes]."""
    model = model or spec()
    net = Network(name)
    x = net.add_input("input", "float32", (batch, size, size, 3))

    def conv(t, c, residual=None):
        params = dict(strides=[c["stride"]] * 2, dilations=[1, 1], pre_padding=[c["pad"]] * 2,
                      post_padding=[c["pad"]] * 2, groups=1)
        if c["relu"]:
            params["activation"] = {"type": "relu"}
        inputs = [t] if residual is None else [t, residual]
        return net.add_layer("Convolution", inputs, params, {"kernel": c["kernel"], "bias": c["bias"]},
                             name=c["name"]).outputs[0]

    y = conv(x, model["stem"])
    y = net.add_layer("Pooling", [y], dict(type="max", window=[3, 3], strides=[2, 2], pre_padding=[1, 1],
                                           post_padding=[1, 1]), name="maxpool").outputs[0]
    for c1, c2, c3, proj in model["blocks"]:
        shortcut = conv(y, proj) if proj is not None else y
        y = conv(conv(conv(y, c1), c2), c3, residual=shortcut)
    y = net.add_layer("Reduce", [y], dict(op="mean", axes=[1, 2], keep_dims=False), name="avgpool").outputs[0]
    fc_w, fc_b = model["fc"]
    w = net.add_constant(fc_w, name="fc.weight")
    y = net.add_layer("MatrixMultiply", [y, w], {}, {"bias": fc_b}, name="fc").outputs[0]
    net.mark_output(y, name="logits")
    return net


def flops(batch: int = 1, size: int = 224, model: dict = None) -> float:
    """Multiply-adds x 2 of the convolutions and the fc layer."""
    model = model or spec()
    total, hw = 0.0, size

    def conv_flops(c, h):
        k, cin, cout = c["kernel"].shape[0], c["kernel"].shape[2], c["kernel"].shape[3]
        out = (h + 2 * c["pad"] - k) // c["stride"] + 1
        return 2.0 * out * out * k * k * cin * cout, out

    f, hw = conv_flops(model["stem"], hw)
    total += f
    hw = (hw + 2 - 3) // 2 + 1
    for c1, c2, c3, proj in model["blocks"]:
        if proj is not None:
            total += conv_flops(proj, hw)[0]
        f1, h1 = conv_flops(c1, hw)
        f2, h2 = conv_flops(c2, h1)
        f3, _ = conv_flops(c3, h2)
        total += f1 + f2 + f3
        hw = h2
    total += 2.0 * model["fc"][0].size
    return total * batch
