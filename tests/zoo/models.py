"""The model zoo: small keras-hub and Keras models with seeded random weights, exported as SavedModels.

Nothing is downloaded: every model is built from constructor arguments (never ``from_preset``). Each entry says
how to build the model, how to export it (``model.export`` gives a ``serving_default`` signature with the model's
real inputs), and the input shapes to build engines for and serve.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Tuple

import numpy as np

__all__ = ["ZooModel", "ZOO", "REQUIRED", "OPTIONAL", "export", "make_feed", "mixed_float16_outputs"]

BATCH, SEQ, VOCAB = 2, 16, 100


@dataclasses.dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[[], object]  # -> a Keras model (weights from the seed set before the call)
    #: input name -> shape to build engines for and serve (the signature's None dims filled in)
    shapes: Dict[str, Tuple[int, ...]]
    #: exports the built model into a directory; None: ``model.export(dir)``
    exporter: Optional[Callable[[object, str], None]] = None
    vocabulary: int = VOCAB
    #: image inputs are pixels in [0, 255) (models that rescale them), else values in +-[0.1, 2]
    pixels: bool = False
    #: the network's own outputs where the others are decoded from them by a loop (NMS): see zoo.measure
    raw_outputs: Tuple[str, ...] = ()
    #: Keras's own fp16 error on the same weights and inputs is measured (mixed_float16_outputs) and printed next to
    #: ours by zoo.measure (no target)
    keras_fp16_reference: bool = False
    #: TF's FP32 outputs with oneDNN's and with Eigen's CPU kernels are measured too: where they lie further than the
    #: FP32 target from the reference, FP32 is held to twice that spread (zoo.measure)
    tf_kernels_reference: bool = False


def _text(token_prefix=""):
    return {f"{token_prefix}token_ids": (BATCH, SEQ), f"{token_prefix}padding_mask": (BATCH, SEQ)}


# -- keras-hub text models ---------------------------------------------------------------------------------------
def _bert():
    import keras_hub
    return keras_hub.models.BertBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=64,
                                         intermediate_dim=128, dropout=0.0, max_sequence_length=SEQ)


def _gpt2():
    import keras_hub
    return keras_hub.models.GPT2Backbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=64,
                                         intermediate_dim=128, dropout=0.0, max_sequence_length=SEQ)


def _llama():
    import keras_hub
    return keras_hub.models.LlamaBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=4,
                                          num_key_value_heads=2, hidden_dim=64, intermediate_dim=128)


def _distilbert():
    import keras_hub
    return keras_hub.models.DistilBertBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=64,
                                               intermediate_dim=128, dropout=0.0, max_sequence_length=SEQ)


def _roberta():
    import keras_hub
    return keras_hub.models.RobertaBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=64,
                                            intermediate_dim=128, dropout=0.0, max_sequence_length=SEQ)


def _gemma():
    import keras_hub
    return keras_hub.models.GemmaBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=4,
                                          num_key_value_heads=1, hidden_dim=64, intermediate_dim=128, head_dim=16)


def _t5():
    import keras_hub
    return keras_hub.models.T5Backbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=64,
                                       intermediate_dim=128, dropout=0.0)


def _whisper():
    import keras_hub
    return keras_hub.models.WhisperBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=64,
                                            intermediate_dim=128, num_mels=16, max_encoder_sequence_length=32,
                                            max_decoder_sequence_length=SEQ)


# -- keras-hub vision models -------------------------------------------------------------------------------------
def _vit():
    import keras_hub
    return keras_hub.models.ViTBackbone(image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=2,
                                        hidden_dim=32, mlp_dim=64)


def _tiny_resnet(image_shape=(None, None, 3)):
    import keras_hub
    return keras_hub.models.ResNetBackbone(input_conv_filters=[64], input_conv_kernel_sizes=[3],
                                           stackwise_num_filters=[64, 32, 32, 32], stackwise_num_blocks=[1, 1, 1, 1],
                                           stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block",
                                           image_shape=image_shape)


def _resnet():
    return _tiny_resnet((32, 32, 3))


def _clip():
    """CLIP's image and text towers and their projections; its text tower sizes its position ids and masks from an
    int64 tf.shape."""
    import keras_hub
    vision = keras_hub.models.CLIPVisionEncoder(patch_size=8, hidden_dim=64, num_layers=2, num_heads=2,
                                                intermediate_dim=128, image_shape=(32, 32, 3))
    text = keras_hub.models.CLIPTextEncoder(vocabulary_size=VOCAB, embedding_dim=64, hidden_dim=64, num_layers=2,
                                            num_heads=2, intermediate_dim=128, max_sequence_length=SEQ)
    return keras_hub.models.CLIPBackbone(vision, text, projection_dim=32)


def _mixtral():
    """A mixture of experts: each token's router picks 2 of 4 experts (top-k, then one-hot masks)."""
    import keras_hub
    return keras_hub.models.MixtralBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=4, hidden_dim=64,
                                            intermediate_dim=128, num_key_value_heads=2, num_experts=4, top_k=2)


def _deeplab():
    """DeepLabV3 on the tiny ResNet: atrous convolutions (SpaceToBatchND -> Conv2D -> BatchToSpaceND in TF's graph)
    in its spatial pyramid pooling, whose projection's BatchNormalization updates its moving statistics as the
    serving function runs (keras-hub calls it in training mode): those variables stay variables, their reads and
    writes native."""
    import keras_hub
    backbone = keras_hub.models.DeepLabV3Backbone(image_encoder=_tiny_resnet((64, 64, 3)),
                                                  spatial_pyramid_pooling_key="P4", upsampling_size=4,
                                                  dilation_rates=[2, 4, 6], low_level_feature_key="P2",
                                                  image_shape=(64, 64, 3))
    return keras_hub.models.DeepLabV3ImageSegmenter(backbone=backbone, num_classes=3)


def _cspdarknet():
    import keras_hub
    # CSPDarkNet-53's configuration (keras_hub/src/utils/timm/convert_cspnet.py), fewer and narrower stages
    return keras_hub.models.CSPNetBackbone(stem_filters=8, stem_kernel_size=3, stem_strides=1,
                                           stackwise_depth=[1, 2, 1], stackwise_strides=[2, 2, 2],
                                           stackwise_num_filters=[16, 32, 64], block_type="dark_block",
                                           stage_type="csp", bottle_ratio=(0.5, 1.0), block_ratio=(1.0, 0.5),
                                           expand_ratio=(2.0, 1.0), stem_padding="same", down_growth=True,
                                           image_shape=(32, 32, 3))


RETINANET_IMAGE = (64, 64, 3)


def _retinanet():
    import keras_hub
    backbone = keras_hub.models.RetinaNetBackbone(image_encoder=_tiny_resnet(RETINANET_IMAGE), min_level=3,
                                                  max_level=5, use_p5=False, image_shape=RETINANET_IMAGE)
    decoder = keras_hub.layers.NonMaxSuppression(bounding_box_format="yxyx", from_logits=True,
                                                 confidence_threshold=0.0, max_detections=8)
    return keras_hub.models.RetinaNetObjectDetector(backbone=backbone, num_classes=3, pre_logits_num_conv_layers=1,
                                                    prediction_decoder=decoder)


def _export_detector(model, directory):
    """A serving signature of the heads and the decoded detections (box decoding, then NMS with its
    tf.while_loops), for any batch. keras-hub's non_max_suppression needs a static batch size: while the signature
    is traced it is swapped for one running it on each image alone (a tf.map_fn over the batch, each image a batch
    of one; it keeps each image's boxes apart either way), so the rest of the decoding still runs on the whole
    batch."""
    import tensorflow as tf
    from keras_hub.src.layers.modeling import non_max_supression as nms

    batched = nms.non_max_suppression

    def per_image(boxes, scores, max_output_size, **kwargs):
        def one(image):
            idx, valid = batched(image[0][None], image[1][None], max_output_size, **kwargs)
            return idx[0], valid[0]
        return tf.map_fn(one, (boxes, scores), fn_output_signature=(
            tf.TensorSpec((max_output_size,), tf.int32), tf.TensorSpec((), tf.int32)))

    @tf.function(input_signature=[tf.TensorSpec((None,) + RETINANET_IMAGE, tf.float32, name="images")])
    def serve(images):
        heads = model(images, training=False)
        return dict(heads, **model.decode_predictions(heads, images))

    nms.non_max_suppression = per_image
    try:
        signature = serve.get_concrete_function()
    finally:
        nms.non_max_suppression = batched
    module = tf.Module()
    module.model = model
    tf.saved_model.save(module, directory, signatures={"serving_default": signature})


def _segformer():
    """SegFormer on a two-stage Mix Transformer: overlapping patch embeddings (strided convolutions), attention whose
    keys and values come from a spatially reduced sequence (a strided convolution over the tokens laid out as an
    image), feed-forward layers with a depthwise convolution between their projections, and a head that resizes
    each stage's features to the first stage's resolution, concatenates them and classifies every pixel. keras-hub
    calls the head's BatchNormalization in training mode: it normalizes with the batch's statistics and writes its
    moving statistics (native variable writes) as it serves."""
    import keras_hub
    encoder = keras_hub.models.MiTBackbone(layerwise_depths=[1, 1], num_layers=2, layerwise_num_heads=[1, 2],
                                           layerwise_sr_ratios=[4, 2], max_drop_path_rate=0.0,
                                           layerwise_patch_sizes=[7, 3], layerwise_strides=[4, 2],
                                           hidden_dims=[16, 32], image_shape=(64, 64, 3))
    backbone = keras_hub.models.SegFormerBackbone(image_encoder=encoder, projection_filters=32)
    return keras_hub.models.SegFormerImageSegmenter(backbone=backbone, num_classes=3)


def _swin():
    """A Swin Transformer: attention within fixed windows of patches plus relative position biases gathered from a
    learned table; every second block attends within windows shifted by half a window (Roll of the token grid, with
    a mask, written region by region by slice updates, that keeps tokens the roll brought together apart); patch
    merging between stages."""
    import keras_hub
    return keras_hub.models.SwinTransformerBackbone(image_shape=(32, 32, 3), embed_dim=32, depths=(2, 2),
                                                    num_heads=(2, 4), window_size=4, patch_size=2, drop_path=0.0)


# -- keras.applications and plain Keras --------------------------------------------------------------------------
def _application(name, size=32):
    def build():
        import keras
        # logits, not a softmax over 1000 classes that random weights make near-uniform (errors hide in it)
        model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3),
                                                  classifier_activation=None)
        _calibrate_batch_norms(model, size)
        return model
    return build


#: The smallest moving variance a calibrated BatchNormalization keeps (see _calibrate_batch_norms).
VARIANCE_FLOOR = 0.1


def _calibrate_batch_norms(model, size):
    """Set every BatchNormalization's moving statistics to those of a forward pass over random pixel images.

    With random weights and fresh statistics (mean 0, variance 1) activations shrink layer by layer: the logits
    of MobileNetV3Small come out ~1e-11 and EfficientNetV2B0's ~2e-3, below what FP16 holds. One training-mode
    call with momentum 0 stores each layer's batch statistics (computed on inputs the earlier layers normalized
    with theirs), so inference normalizes every layer as trained weights would: logits of ~10 and ~100.
    Variances are floored at VARIANCE_FLOOR: a channel nearly constant over 16 random images (variance ~1e-10)
    would otherwise be scaled up ~30x by the epsilon alone, an amplifier trained networks do not have, which
    makes the model so ill-conditioned that float32 rounding differences between any two implementations
    show in its logits.
    """
    import keras

    norms = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
    for layer in norms:
        layer.momentum = 0.0
    if norms:
        model(np.random.default_rng(0).uniform(0.0, 255.0, (16, size, size, 3)).astype("float32"), training=True)
    for layer in norms:
        layer.moving_variance.assign(np.maximum(layer.moving_variance.numpy(), VARIANCE_FLOOR))


def _lstm():
    """A text classifier as users build one: token embeddings, an LSTM over them, a Dense head."""
    import keras
    inputs = keras.Input((SEQ,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(VOCAB, 16)(inputs)
    x = keras.layers.LSTM(32)(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def _image(size=32):
    return {"images": (BATCH, size, size, 3)}


def _entries(*models):
    return {m.name: m for m in models}


#: Models the zoo tests hold to the issue's targets.
REQUIRED = _entries(
    ZooModel("bert", _bert, dict(_text(), segment_ids=(BATCH, SEQ))),
    ZooModel("gpt2", _gpt2, _text()),
    ZooModel("llama", _llama, _text()),
    ZooModel("vit", _vit, _image()),
    ZooModel("resnet", _resnet, _image()),
    ZooModel("deeplabv3", _deeplab, _image(64), pixels=True),
    ZooModel("clip", _clip, dict(_image(), token_ids=(BATCH, SEQ))),
    ZooModel("mixtral", _mixtral, _text()),
    ZooModel("cspdarknet", _cspdarknet, _image()),
    ZooModel("retinanet", _retinanet, {"images": (BATCH,) + RETINANET_IMAGE}, exporter=_export_detector,
             raw_outputs=("bbox_regression", "cls_logits")),
    ZooModel("convnext_tiny", _application("ConvNeXtTiny"), _image(), pixels=True),
    # TF's oneDNN and Eigen kernels lie 0.6e-4 to 1.3e-4 of its logits' scale (~58) apart on an AVX-512 host
    ZooModel("efficientnetv2_b0", _application("EfficientNetV2B0"), _image(), pixels=True, keras_fp16_reference=True,
             tf_kernels_reference=True),
    # Keras itself under mixed_float16 errs by 1.3e-2 of the logits' scale (median; 5e-3 to 2.4e-2) over 12 random
    # batches of 2 (one rounding per layer: ~16 blocks of hard-swish, depthwise and squeeze-excite layers): printed
    ZooModel("mobilenetv3_small", _application("MobileNetV3Small"), _image(), pixels=True,
             keras_fp16_reference=True),
    ZooModel("lstm", _lstm, {"token_ids": (BATCH, SEQ)}),
    ZooModel("segformer", _segformer, _image(64)),
    ZooModel("swin", _swin, _image()),
)

#: More keras-hub models, measured by benchmarks/zoo_report.py only.
OPTIONAL = _entries(
    ZooModel("distilbert", _distilbert, _text()),
    ZooModel("roberta", _roberta, _text()),
    ZooModel("gemma", _gemma, _text()),
    ZooModel("t5", _t5, dict(_text("encoder_"), **_text("decoder_"))),
    ZooModel("whisper", _whisper, dict(encoder_features=(BATCH, 32, 16), **_text("decoder_"))),
)

ZOO = dict(REQUIRED, **OPTIONAL)


def export(model: ZooModel, directory: str, seed: int = 0):
    """Build `model` with weights drawn from `seed` and export it as a SavedModel in `directory`; returns the
    built Keras model."""
    import keras

    keras.backend.clear_session()  # else a Keras application built after another model fails to export
    keras.utils.set_random_seed(seed)
    built = model.build()
    if model.exporter is not None:
        model.exporter(built, directory)
    else:
        built.export(directory, verbose=False)
    return built


def mixed_float16_outputs(model: ZooModel, built, feed: Dict[str, np.ndarray]) -> np.ndarray:
    """The output of `built` (a single-input, single-output Keras model `model` built) on `feed` as Keras computes
    it in fp16: the model rebuilt under the ``mixed_float16`` policy, given `built`'s weights."""
    import keras

    weights = built.get_weights()
    keras.backend.clear_session()  # resets the policy too: set it after
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        twin = model.build()
        twin.set_weights(weights)
        (value,) = feed.values()
        return np.asarray(twin(value, training=False), np.float32)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def make_feed(model: ZooModel, specs, seed: int, batch: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Random inputs for the signature `specs` (name -> tf.TensorSpec) at `model.shapes` (with `batch` as every
    input's dim 0 where given): token ids in [1, vocabulary), padding masks of ones then zeros (each row at least
    half real tokens), segment ids 0/1, pixels in [0, 255) where `model.pixels`, other values in +-[0.1, 2]."""
    rng = np.random.default_rng(seed)
    shapes = {k: v if batch is None else (batch,) + tuple(v[1:]) for k, v in model.shapes.items()}
    if len(specs) == len(shapes) == 1:  # Keras names a lone input after its tensor ("keras_tensor_<n>")
        shapes = {next(iter(specs)): next(iter(shapes.values()))}
    feed = {}
    for name, spec in sorted(specs.items()):
        shape = shapes[name]
        dtype = spec.dtype.as_numpy_dtype
        if name.endswith("padding_mask"):
            lengths = rng.integers(shape[-1] // 2, shape[-1] + 1, size=shape[:-1])
            value = np.arange(shape[-1]) < lengths[..., None]
        elif name.endswith("token_ids"):
            value = rng.integers(1, model.vocabulary, size=shape)
        elif name.endswith("segment_ids"):
            value = rng.integers(0, 2, size=shape)
        elif model.pixels:
            value = rng.uniform(0.0, 255.0, size=shape)
        else:
            value = rng.uniform(0.1, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
        feed[name] = np.asarray(value).astype(dtype)
    return feed
