"""ResNet-50 v1.5 built directly with the Network API: batch norm folded into each convolution
(random weights, He-scaled so activations stay O(1)), ReLU and the residual sum fused into the
convolutions, max pool, global mean, a fully connected layer. ``spec`` describes the same model for
other frameworks (the GPU benchmark copies it into PyTorch); ``spec_from_network`` reads it back from a
built engine's network (such as a converted Keras ResNet-50 v1.5 plan's)."""
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


def _conv_spec(layer, name: str, relu: bool) -> dict:
    """The spec dict of a built Convolution layer (square kernel, equal strides, symmetric padding)."""
    p, k = layer.params, np.asarray(layer.weights["kernel"], np.float32)
    pre, post, strides = list(p["pre_padding"]), list(p["post_padding"]), list(p["strides"])
    if k.ndim != 4 or k.shape[0] != k.shape[1] or p.get("groups", 1) != 1 or list(p["dilations"]) != [1, 1]:
        raise ValueError(f"{layer.name!r}: not a square, ungrouped, undilated 2-d convolution ({k.shape}, {p})")
    if pre != post or len(set(pre)) != 1 or len(set(strides)) != 1:
        raise ValueError(f"{layer.name!r}: padding {pre}/{post} or strides {strides} are not symmetric")
    bias = layer.weights.get("bias")
    bias = np.zeros(k.shape[3], np.float32) if bias is None else np.asarray(bias, np.float32)
    return {"name": name, "kernel": k.copy(), "bias": bias.copy(), "stride": strides[0], "pad": pre[0],
            "relu": relu}


def _has_relu(layer) -> bool:
    act = layer.params.get("activation")
    if act is not None and act.get("type") != "relu":
        raise ValueError(f"{layer.name!r}: activation {act} is not a ReLU")
    return act is not None


def spec_from_network(network) -> dict:
    """The ``spec`` of a built ResNet-50-shaped Network: a stem convolution + ReLU, a 3x3 / 2 max pool
    padded by 1, bottleneck blocks (1x1, 3x3, 1x1 convolutions, ReLU after the first two and after the
    residual sum, which is fused into the last one or into the 1x1 projection shortcut), a mean over H
    and W, then a MatrixMultiply by a Constant with an optional fused bias. Each block with a projection
    starts a stage; names follow torchvision's. Raises ValueError naming the first layer that does not fit."""
    producer = {t.name: layer for layer in network.layers for t in layer.outputs}

    def made_by(t, kind):
        layer = producer.get(t.name)
        if layer is None or layer.kind != kind:
            found = "a network input" if layer is None else f"{layer.kind} {layer.name!r}"
            raise ValueError(f"not a ResNet-50 chain: expected a {kind} producing {t.name!r}, found {found}")
        return layer

    def back(t, convs):
        """{tensor name: the convolutions, in order, from that tensor to the block's end} walking back from
        `t` (which `convs` lead from) through up to 3 single-input convolutions."""
        out = {t.name: convs}
        while len(convs) < 3 and t.name in producer:
            layer = producer[t.name]
            if layer.kind != "Convolution" or len(layer.inputs) != 1:
                break
            convs, t = [layer] + convs, layer.inputs[0]
            out[t.name] = convs
        return out

    if len(network.inputs) != 1 or len(network.outputs) != 1:
        raise ValueError(f"not a ResNet-50 chain: {len(network.inputs)} inputs, {len(network.outputs)} outputs")
    fc = made_by(network.outputs[0], "MatrixMultiply")
    if fc.params.get("transpose_a") or fc.params.get("activation"):
        raise ValueError(f"{fc.name!r}: the classifier must be x @ w (+ bias), got {fc.params}")
    w = np.asarray(made_by(fc.inputs[1], "Constant").weights["value"], np.float32)
    w = w.T.copy() if fc.params.get("transpose_b") else w.copy()
    b = np.asarray(fc.weights.get("bias", np.zeros(w.shape[1])), np.float32).copy()
    mean = made_by(fc.inputs[0], "Reduce")
    axes = sorted(a % mean.inputs[0].rank for a in mean.params["axes"])
    if mean.params["op"] != "mean" or axes != [1, 2] or mean.params.get("keep_dims") or mean.params.get("first_perm"):
        raise ValueError(f"{mean.name!r}: expected a mean over H and W, got {mean.params}")

    def block_end(t):
        layer = producer.get(t.name)
        return layer if layer is not None and layer.kind == "Convolution" and len(layer.inputs) == 2 else None

    blocks, y = [], mean.inputs[0]
    while (end := block_end(y)) is not None:
        main, residual = back(end.inputs[0], [end]), back(end.inputs[1], [])
        joint = next((name for name in main if name in residual), None)
        if joint is None:
            raise ValueError(f"{end.name!r}: its input and residual do not meet within a bottleneck block")
        branches = sorted([main[joint], residual[joint]], key=len)
        if [len(c) for c in branches] not in ([0, 3], [1, 3]):
            raise ValueError(f"{end.name!r}: branches of {[len(c) for c in branches]} convolutions, expected 3 and "
                             f"0 or 1")
        (c1, c2, c3), proj = branches[1], (branches[0] or [None])[0]
        plain = [c for c in (c3, proj) if c is not None and c is not end]
        if not (_has_relu(c1) and _has_relu(c2) and _has_relu(end)) or any(_has_relu(c) for c in plain):
            raise ValueError(f"{end.name!r}: ReLU must follow the block's first two convolutions and its sum only")
        blocks.append((c1, c2, c3, proj))
        y = c1.inputs[0]

    pool = made_by(y, "Pooling")
    p = pool.params
    if (p["type"], *(list(p[k]) for k in ("window", "strides", "pre_padding", "post_padding"))) != \
            ("max", [3, 3], [2, 2], [1, 1], [1, 1]):
        raise ValueError(f"{pool.name!r}: expected a 3x3 / 2 max pool padded by 1 on each side, got {p}")
    stem = made_by(pool.inputs[0], "Convolution")
    if len(stem.inputs) != 1 or stem.inputs[0] is not network.inputs[0] or not _has_relu(stem):
        raise ValueError(f"{stem.name!r}: the stem must be a convolution + ReLU of the network input")

    specs, stage, index = [], 0, 0
    for c1, c2, c3, proj in reversed(blocks):
        stage, index = (stage + 1, 0) if proj is not None else (stage, index + 1)
        name = f"layer{stage}.{index}"
        if stage == 0:
            raise ValueError(f"{c1.name!r}: the first block has no projection shortcut")
        if [c.weights["kernel"].shape[0] for c in (c1, c2, c3, proj or c1)] != [1, 3, 1, 1]:
            raise ValueError(f"{c1.name!r}: block {name} is not a 1x1 / 3x3 / 1x1 bottleneck with a 1x1 projection")
        specs.append((_conv_spec(c1, f"{name}.conv1", True), _conv_spec(c2, f"{name}.conv2", True),
                      _conv_spec(c3, f"{name}.conv3", True),
                      None if proj is None else _conv_spec(proj, f"{name}.downsample", False)))
    return {"stem": _conv_spec(stem, "conv1", True), "blocks": specs, "fc": (w, b), "classes": w.shape[1]}


def calibrated_engine(model: dict, precision: str, rng, batch: int = 2, size: int = 64, **config):
    """An engine of ``network(batch, size, model)`` built in `precision` on the cupy backend (more BuilderConfig
    in `config`), each tensor's range its max |value| over two random batches through the FP32 network."""
    from gpu_calibrate import apply_ranges, max_abs_ranges
    from tftrt_py.engine import Builder, BuilderConfig

    batches = [{"input": rng.standard_normal((batch, size, size, 3)).astype(np.float32)} for _ in range(2)]
    ranges = max_abs_ranges(lambda: network(batch, size, model), batches)
    return Builder(BuilderConfig(precision=precision, backend="cupy", **config)).build_engine(
        apply_ranges(network(batch, size, model), ranges))
