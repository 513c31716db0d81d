"""The zoo's workloads: one entry each, name -> (family, package, builder, task).

The first entries are the original zoo (benchmarks and tests name them; keep them as they are);
the rest are grouped by task. New transformers models use small configs and the library's default
call (decoders and encoder-decoders return their cache), and never a pretrained backbone.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ._common import _Spec
from ._diffusers import DIFFUSION
from ._grace import (
    clip,
    deep_recommender,
    speaker_encoder,
    speech_transformer,
    xlnet_host_positions,
)
from ._grace_dalle2 import dalle2
from ._grace_ocean import ocean_equation_of_state, ocean_isoneutral_mixing, ocean_turbulence
from ._transformers import (
    MakeKwargs,
    _clip,
    _hf,
    _hf_pixels,
    _image_text,
    _log_mel,
    _pixels,
    _spectrogram,
    _tokens,
    _transformers,
    _waveform,
)
from ._vision import _raft, _timm, _tv_detector, _tv_segmentation, _tv_video


def _tm(arch: str, size: int = 224) -> _Spec:
    return _Spec("timm", "timm", partial(_timm, arch, size=size), "classification")


def _tv(builder: Any, arch: str, task: str, **sizes: int) -> _Spec:
    return _Spec("torchvision", "torchvision", partial(builder, arch, **sizes), task)


def _tf(
    task: str,
    model_cls: str,
    config_cls: str,
    make_kwargs: MakeKwargs,
    *,
    package: str = "transformers",
    sdpa: bool = True,
    **config: Any,
) -> _Spec:
    return _Spec(
        "transformers", package, partial(_transformers, model_cls, config_cls, make_kwargs, sdpa=sdpa, **config), task
    )


# Small transformer sizes shared by the new text / vision / audio entries.
_TEXT = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 512}
_GQA = {**_TEXT, "num_key_value_heads": 2}
_SEQ2SEQ = {
    "d_model": 256,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 512,
    "decoder_ffn_dim": 512,
}
_VIT = {"hidden_size": 192, "num_hidden_layers": 4, "num_attention_heads": 3, "intermediate_size": 768}
_SWIN = {"embed_dim": 48, "depths": [2, 2, 2, 2], "num_heads": [3, 3, 6, 12]}
_CONVNEXT = {"hidden_sizes": [40, 80, 160, 320], "depths": [2, 2, 2, 2]}
_WAV = {**_VIT, "conv_dim": (256,) * 7, "num_conv_pos_embeddings": 64}
# DETR family: a small transformers ResNet instead of the timm resnet50 the config names by default.
_RESNET = {
    "model_type": "resnet",
    "embedding_size": 32,
    "hidden_sizes": [64, 128, 256, 512],
    "depths": [1, 1, 1, 1],
    "layer_type": "basic",
    "out_features": ["stage1", "stage2", "stage3", "stage4"],
}
_DETR = {
    "sdpa": False,  # the ResNet backbone refuses an explicit attention implementation
    "backbone_config": _RESNET,
    "use_timm_backbone": False,  # transformers < 5 reads these two; 5.x builds the given config
    "use_pretrained_backbone": False,
    "d_model": 128,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 8,  # DetrForSegmentation's mask head needs d_model + heads divisible by 8
    "decoder_attention_heads": 8,
    "encoder_ffn_dim": 256,
    "decoder_ffn_dim": 256,
    "num_queries": 100,
}

_ORIGINAL: dict[str, _Spec] = {
    **{
        f"timm:{arch}": _Spec("timm", "timm", partial(_timm, arch), "classification")
        for arch in (
            "resnet18",
            "mobilenetv3_small_100",
            "efficientnet_b0",
            "convnext_atto",
            "vit_tiny_patch16_224",
            "resnet50",
        )
    },
    "hf:bert-base": _Spec(
        "transformers",
        "transformers",
        partial(_hf, "BertModel", "BertConfig", 128, fills={"attention_mask": 1, "token_type_ids": 0}),
        "encoder",
    ),
    "hf:gpt2": _Spec(
        "transformers",
        "transformers",
        partial(_hf, "GPT2LMHeadModel", "GPT2Config", 64, flags={"use_cache": False}),
        "decoder",
    ),
    "hf:t5-small": _Spec(
        "transformers",
        "transformers",
        partial(
            _hf,
            "T5ForConditionalGeneration",
            "T5Config",
            64,
            ids=("input_ids", "decoder_input_ids"),
            flags={"use_cache": False},
            d_model=512,
            d_ff=2048,
            num_layers=6,
            num_heads=8,
            vocab_size=32128,
        ),
        "encoder-decoder",
    ),
    "hf:xlnet-base": _Spec(
        "transformers",
        "transformers",
        # XLNet returns `mems` in eval by default; turn it off in the config and the call.
        partial(_hf, "XLNetModel", "XLNetConfig", 64, flags={"use_mems": False}, use_mems_eval=False),
        "encoder",
    ),
    "tv:fasterrcnn_mobilenet_v3_large_fpn": _Spec(
        "torchvision", "torchvision", partial(_tv_detector, "fasterrcnn_mobilenet_v3_large_fpn"), "detection"
    ),
    # Models a host->device copy keeps out of plain capture (DESIGN.md): the compiler path's CGCT cases.
    **{
        f"tv:{arch}": _Spec("torchvision", "torchvision", partial(_tv_detector, arch), task)
        for arch, task in (
            ("fasterrcnn_resnet50_fpn", "detection"),
            ("retinanet_resnet50_fpn", "detection"),
            ("fcos_resnet50_fpn", "detection"),
            ("maskrcnn_resnet50_fpn", "instance-segmentation"),
            ("ssdlite320_mobilenet_v3_large", "detection"),
        )
    },
    "tv:raft_small": _Spec("torchvision", "torchvision", _raft, "optical-flow"),
    "hf:mistral-tiny": _Spec(
        "transformers",
        "transformers",
        partial(
            _hf,
            "MistralForCausalLM",
            "MistralConfig",
            64,
            flags={"use_cache": False},
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        ),
        "decoder",
    ),
    "hf:rt-detr": _Spec(
        "transformers",
        "transformers",
        partial(_hf_pixels, "RTDetrForObjectDetection", "RTDetrConfig", 320),
        "detection",
    ),
    "hf:mask2former": _Spec(  # its loss module imports scipy at construction
        "transformers",
        "scipy",
        partial(_hf_pixels, "Mask2FormerForUniversalSegmentation", "Mask2FormerConfig", 256),
        "semantic-segmentation",
    ),
}

_CLASSIFICATION: dict[str, _Spec] = {
    f"timm:{arch}": _tm(arch, size)
    for arch, size in (
        ("regnety_004", 224),
        ("densenet121", 224),
        ("inception_v3", 299),
        ("hrnet_w18_small", 224),
        ("repvgg_a0", 224),
        ("ghostnet_100", 224),
        ("mobilenetv4_conv_small", 224),
        ("efficientvit_b0", 224),
        ("mobilevit_xxs", 256),
        ("fastvit_t8", 256),
        ("deit_tiny_patch16_224", 224),
        ("cait_xxs24_224", 224),
        ("xcit_nano_12_p16_224", 224),
        ("eva02_tiny_patch14_224", 224),
        ("beit_base_patch16_224", 224),
        ("swin_tiny_patch4_window7_224", 224),
        ("hiera_tiny_224", 224),
        ("pvt_v2_b0", 224),
        ("coatnet_nano_rw_224", 224),
        ("levit_128s", 224),
        ("mixer_s16_224", 224),
        ("poolformer_s12", 224),
    )
}

_DETECTION: dict[str, _Spec] = {
    "tv:fasterrcnn_mobilenet_v3_large_320_fpn": _tv(_tv_detector, "fasterrcnn_mobilenet_v3_large_320_fpn", "detection"),
    "tv:fasterrcnn_resnet50_fpn_v2": _tv(_tv_detector, "fasterrcnn_resnet50_fpn_v2", "detection"),
    "tv:ssd300_vgg16": _tv(_tv_detector, "ssd300_vgg16", "detection", size=300),
    "hf:detr": _tf("detection", "DetrForObjectDetection", "DetrConfig", partial(_pixels, 320), **_DETR),
    "hf:conditional-detr": _tf(
        "detection", "ConditionalDetrForObjectDetection", "ConditionalDetrConfig", partial(_pixels, 320), **_DETR
    ),
    "hf:deformable-detr": _tf(
        "detection",
        "DeformableDetrForObjectDetection",
        "DeformableDetrConfig",
        partial(_pixels, 320),
        **{**_DETR, "backbone_config": {**_RESNET, "out_features": ["stage2", "stage3", "stage4"]}},
    ),
    "hf:yolos-tiny": _tf(
        "detection",
        "YolosForObjectDetection",
        "YolosConfig",
        partial(_pixels, 320),
        image_size=[320, 320],
        num_detection_tokens=100,
        **_VIT,
    ),
    # Default configs (random ResNet-50 / HGNetV2 backbones), like hf:rt-detr.
    "hf:rt-detr-v2": _tf(
        "detection", "RTDetrV2ForObjectDetection", "RTDetrV2Config", partial(_pixels, 320), sdpa=False
    ),
    "hf:d-fine": _tf("detection", "DFineForObjectDetection", "DFineConfig", partial(_pixels, 320), sdpa=False),
}

_SEGMENTATION: dict[str, _Spec] = {
    "tv:maskrcnn_resnet50_fpn_v2": _tv(_tv_detector, "maskrcnn_resnet50_fpn_v2", "instance-segmentation"),
    "hf:detr-panoptic": _tf(
        "instance-segmentation", "DetrForSegmentation", "DetrConfig", partial(_pixels, 320), **_DETR
    ),
    **{
        f"tv:{arch}": _tv(_tv_segmentation, arch, "semantic-segmentation")
        for arch in (
            "deeplabv3_mobilenet_v3_large",
            "deeplabv3_resnet50",
            "lraspp_mobilenet_v3_large",
            "fcn_resnet50",
        )
    },
    "hf:segformer-b0": _tf(  # the default config is MiT-b0
        "semantic-segmentation", "SegformerForSemanticSegmentation", "SegformerConfig", partial(_pixels, 256)
    ),
    "hf:dpt-tiny": _tf(
        "semantic-segmentation",
        "DPTForSemanticSegmentation",
        "DPTConfig",
        partial(_pixels, 256),
        image_size=256,
        backbone_out_indices=[0, 1, 2, 3],
        neck_hidden_sizes=[48, 96, 192, 384],
        fusion_hidden_size=128,
        **_VIT,
    ),
    "hf:upernet-convnext": _tf(
        "semantic-segmentation",
        "UperNetForSemanticSegmentation",
        "UperNetConfig",
        partial(_pixels, 256),
        sdpa=False,
        backbone_config={
            "model_type": "convnext",
            **_CONVNEXT,
            "out_features": ["stage1", "stage2", "stage3", "stage4"],
        },
        use_pretrained_backbone=False,
        hidden_size=128,
        auxiliary_channels=64,
    ),
}

_KEYPOINTS: dict[str, _Spec] = {
    "tv:keypointrcnn_resnet50_fpn": _tv(_tv_detector, "keypointrcnn_resnet50_fpn", "keypoints"),
    "hf:vitpose-tiny": _tf(  # top-down: one 256x192 person crop -> 17 COCO keypoint heatmaps
        "keypoints",
        "VitPoseForPoseEstimation",
        "VitPoseConfig",
        partial(_pixels, (256, 192)),
        sdpa=False,
        num_labels=17,
        backbone_config={"model_type": "vitpose_backbone", "image_size": [256, 192], "patch_size": [16, 16], **_VIT},
    ),
    # Interest points above a score threshold: the number of keypoints depends on the values.
    "hf:superpoint": _tf(
        "keypoints", "SuperPointForKeypointDetection", "SuperPointConfig", partial(_pixels, (240, 320)), sdpa=False
    ),
}

_VIDEO: dict[str, _Spec] = {
    **{f"tv:{arch}": _tv(_tv_video, arch, "video") for arch in ("r3d_18", "mc3_18", "r2plus1d_18", "swin3d_t")},
    # Their pooling / positional tables fix the clip size: 16 frames of 224x224.
    **{f"tv:{arch}": _tv(_tv_video, arch, "video", frames=16, size=224) for arch in ("s3d", "mvit_v1_b", "mvit_v2_s")},
    **{
        f"hf:{short}-tiny": _tf(
            "video",
            f"{model}ForVideoClassification",
            f"{model}Config",
            partial(_clip, 8, 112),
            image_size=112,
            num_frames=8,
            num_labels=400,
            **_VIT,
        )
        for short, model in (("videomae", "VideoMAE"), ("timesformer", "Timesformer"), ("vivit", "Vivit"))
    },
}

_FLOW: dict[str, _Spec] = {
    "tv:raft_large": _Spec("torchvision", "torchvision", partial(_raft, arch="raft_large"), "optical-flow"),
}

_ENCODERS: dict[str, _Spec] = {
    "hf:roberta-tiny": _tf("encoder", "RobertaModel", "RobertaConfig", partial(_tokens, 128), **_TEXT),
    "hf:distilbert-tiny": _tf(
        "encoder",
        "DistilBertModel",
        "DistilBertConfig",
        partial(_tokens, 128),
        dim=256,
        n_layers=2,
        n_heads=4,
        hidden_dim=512,
    ),
    "hf:albert-tiny": _tf(
        "encoder", "AlbertModel", "AlbertConfig", partial(_tokens, 128, type_ids=True), embedding_size=128, **_TEXT
    ),
    "hf:electra-tiny": _tf(
        "encoder", "ElectraModel", "ElectraConfig", partial(_tokens, 128, type_ids=True), embedding_size=128, **_TEXT
    ),
    "hf:deberta-v2-tiny": _tf(  # DeBERTa-v3 style disentangled relative attention
        "encoder",
        "DebertaV2Model",
        "DebertaV2Config",
        partial(_tokens, 128),
        vocab_size=32000,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        position_buckets=256,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        max_relative_positions=-1,
        position_biased_input=False,
        **_TEXT,
    ),
    "hf:modernbert-tiny": _tf(  # 3 layers: one global, two sliding-window (local) attention layers
        "encoder",
        "ModernBertModel",
        "ModernBertConfig",
        partial(_tokens, 128),
        **{**_TEXT, "num_hidden_layers": 3},
    ),
}


def _causal(model: str, config: str | None = None, **sizes: Any) -> _Spec:
    return _tf("decoder", f"{model}ForCausalLM", config or f"{model}Config", partial(_tokens, 64), **sizes)


# Decoders: the default call, so each returns its KV cache (hf:gpt2 and hf:mistral-tiny don't).
_DECODERS: dict[str, _Spec] = {
    "hf:llama-tiny": _causal("Llama", **_GQA),
    "hf:qwen2-tiny": _causal("Qwen2", vocab_size=32000, **_GQA),
    "hf:qwen3-tiny": _causal("Qwen3", vocab_size=32000, head_dim=64, **_GQA),
    "hf:qwen2-moe-tiny": _causal(
        "Qwen2Moe",
        vocab_size=32000,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=512,
        **_GQA,
    ),
    "hf:mixtral-tiny": _causal("Mixtral", num_local_experts=4, num_experts_per_tok=2, **_GQA),
    "hf:phi-tiny": _causal("Phi", **_TEXT),
    "hf:phi3-tiny": _causal("Phi3", **_GQA),
    "hf:gemma-tiny": _causal("Gemma", vocab_size=32000, head_dim=64, **_GQA),
    "hf:gemma2-tiny": _causal("Gemma2", vocab_size=32000, head_dim=64, sliding_window=32, **_GQA),
    "hf:gemma3-tiny": _causal("Gemma3", "Gemma3TextConfig", vocab_size=32000, head_dim=64, sliding_window=32, **_GQA),
    "hf:olmo-tiny": _causal("Olmo", **_GQA),
    "hf:stablelm-tiny": _causal("StableLm", **_GQA),
    "hf:opt-tiny": _causal(
        "OPT", hidden_size=256, ffn_dim=512, num_hidden_layers=2, num_attention_heads=4, word_embed_proj_dim=256
    ),
    "hf:gpt-neo-tiny": _causal(  # one global and one local (windowed) attention layer
        "GPTNeo", hidden_size=256, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=32
    ),
    "hf:gpt-neox-tiny": _causal("GPTNeoX", **_TEXT),
    "hf:gptj-tiny": _causal("GPTJ", n_embd=256, n_layer=2, n_head=4, rotary_dim=32),
    "hf:falcon-tiny": _causal(  # the Falcon-40B layout: grouped KV heads, parallel attention / MLP
        "Falcon",
        vocab_size=32000,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_kv_heads=2,
        new_decoder_architecture=True,
    ),
    "hf:bloom-tiny": _causal("Bloom", vocab_size=32000, hidden_size=256, n_layer=2, n_head=4),  # ALiBi
}

# Encoder-decoders: the default call (the decoder's cache comes back), with decoder_input_ids.
_SEQ2SEQS: dict[str, _Spec] = {
    **{
        f"hf:{short}-tiny": _tf(
            "encoder-decoder", model, f"{config}Config", partial(_tokens, 64, decoder=64), **_SEQ2SEQ, **extra
        )
        for short, model, config, extra in (
            ("bart", "BartForConditionalGeneration", "Bart", {}),
            ("mbart", "MBartForConditionalGeneration", "MBart", {}),
            ("marian", "MarianMTModel", "Marian", {}),
            ("pegasus", "PegasusForConditionalGeneration", "Pegasus", {}),
            ("m2m100", "M2M100ForConditionalGeneration", "M2M100", {"vocab_size": 32000}),
        )
    },
    "hf:mt5-tiny": _tf(
        "encoder-decoder",
        "MT5ForConditionalGeneration",
        "MT5Config",
        partial(_tokens, 64, decoder=64),
        vocab_size=32000,
        d_model=256,
        d_kv=32,
        d_ff=512,
        num_layers=2,
        num_heads=8,
    ),
    "hf:whisper-tiny": _tf(  # 1 s of audio: 100 log-mel frames
        "encoder-decoder",
        "WhisperForConditionalGeneration",
        "WhisperConfig",
        partial(_log_mel, decoder=32),
        max_source_positions=50,
        **_SEQ2SEQ,
    ),
}

_VISION: dict[str, _Spec] = {
    "hf:vit-tiny": _tf(
        "vision", "ViTForImageClassification", "ViTConfig", partial(_pixels, 224), num_labels=1000, **_VIT
    ),
    "hf:deit-tiny": _tf(  # class and distillation tokens
        "vision",
        "DeiTForImageClassificationWithTeacher",
        "DeiTConfig",
        partial(_pixels, 224),
        num_labels=1000,
        **_VIT,
    ),
    "hf:beit-tiny": _tf(
        "vision",
        "BeitForImageClassification",
        "BeitConfig",
        partial(_pixels, 224),
        num_labels=1000,
        use_relative_position_bias=True,
        **_VIT,
    ),
    "hf:dinov2-tiny": _tf("vision", "Dinov2Model", "Dinov2Config", partial(_pixels, 224), **_VIT),
    "hf:clip-vision-tiny": _tf("vision", "CLIPVisionModel", "CLIPVisionConfig", partial(_pixels, 224), **_VIT),
    "hf:siglip-vision-tiny": _tf("vision", "SiglipVisionModel", "SiglipVisionConfig", partial(_pixels, 224), **_VIT),
    "hf:clip-tiny": _tf(  # both towers and the image-text logits
        "vision",
        "CLIPModel",
        "CLIPConfig",
        partial(_image_text, 224, 16),
        vision_config=_VIT,
        text_config=_VIT,
        projection_dim=128,
    ),
    "hf:swin-tiny": _tf(
        "vision", "SwinForImageClassification", "SwinConfig", partial(_pixels, 224), num_labels=1000, **_SWIN
    ),
    "hf:swinv2-tiny": _tf(
        "vision",
        "Swinv2ForImageClassification",
        "Swinv2Config",
        partial(_pixels, 256),
        num_labels=1000,
        window_size=8,
        **_SWIN,
    ),
    "hf:convnext-tiny": _tf(
        "vision",
        "ConvNextForImageClassification",
        "ConvNextConfig",
        partial(_pixels, 224),
        num_labels=1000,
        **_CONVNEXT,
    ),
    "hf:convnextv2-tiny": _tf(
        "vision",
        "ConvNextV2ForImageClassification",
        "ConvNextV2Config",
        partial(_pixels, 224),
        num_labels=1000,
        **_CONVNEXT,
    ),
    "hf:mobilevit-small": _tf(  # the default config is MobileViT-S
        "vision", "MobileViTForImageClassification", "MobileViTConfig", partial(_pixels, 256), num_labels=1000
    ),
}

_AUDIO: dict[str, _Spec] = {
    **{
        f"hf:{short}-tiny": _tf("audio", f"{model}Model", f"{model}Config", partial(_waveform, 16000), **_WAV)
        for short, model in (("wav2vec2", "Wav2Vec2"), ("hubert", "Hubert"), ("wavlm", "WavLM"))
    },
    "hf:data2vec-audio-tiny": _tf(
        "audio",
        "Data2VecAudioModel",
        "Data2VecAudioConfig",
        partial(_waveform, 16000),
        **{**_VIT, "conv_dim": (256,) * 7},
    ),
    "hf:whisper-encoder-tiny": _tf(  # the Whisper encoder with a classification head, on 1 s of log-mel
        "audio",
        "WhisperForAudioClassification",
        "WhisperConfig",
        _log_mel,
        max_source_positions=50,
        **_SEQ2SEQ,
    ),
    "hf:ast-tiny": _tf(  # Audio Spectrogram Transformer on ~1 s of 128-bin filterbank frames
        "audio", "ASTForAudioClassification", "ASTConfig", _spectrogram, max_length=100, num_labels=527, **_VIT
    ),
}

# GraCE's workloads (``_grace``): the models its evaluation names, as PyTorch's benchmark runners configure them.
_GRACE = {
    "grace:xlnet": _Spec("grace", "transformers", xlnet_host_positions, "encoder"),
    "grace:deep-recommender": _Spec("grace", "torch", deep_recommender, "recommendation"),
    "grace:clip": _Spec("grace", "torch", clip, "vision"),
    "grace:ocean-equation-of-state": _Spec("grace", "torch", ocean_equation_of_state, "scientific"),
    "grace:speaker-encoder": _Spec("grace", "torch", speaker_encoder, "audio"),
    "grace:ocean-turbulence": _Spec("grace", "torch", ocean_turbulence, "scientific"),
    "grace:ocean-isoneutral-mixing": _Spec("grace", "torch", ocean_isoneutral_mixing, "scientific"),
    "grace:dalle2": _Spec("grace", "torch", dalle2, "diffusion"),
    "grace:speech-transformer": _Spec("grace", "torch", speech_transformer, "audio"),
    "grace:blenderbot-small": _Spec(
        "grace",
        "transformers",
        partial(
            _hf,
            "BlenderbotSmallForConditionalGeneration",
            "BlenderbotSmallConfig",
            128,
            ids=("input_ids", "decoder_input_ids"),
        ),
        "encoder-decoder",
    ),
    "grace:mt5": _Spec(
        "grace",
        "transformers",
        partial(
            _hf,
            "MT5ForConditionalGeneration",
            "MT5Config",
            128,
            ids=("input_ids", "decoder_input_ids"),
            tie_word_embeddings=False,  # transformers 4.x's default for MT5, as the benchmark runners built it
        ),
        "encoder-decoder",
    ),
    "timm:lcnet_050": _tm("lcnet_050"),  # a member of the TIMM suite GraCE draws from
    "grace:mobilebert": _Spec(
        "grace", "transformers", partial(_hf, "MobileBertForMaskedLM", "MobileBertConfig", 128), "encoder"
    ),
}

_REGISTRY: dict[str, _Spec] = {
    **_ORIGINAL,
    **_CLASSIFICATION,
    **_DETECTION,
    **_SEGMENTATION,
    **_KEYPOINTS,
    **_VIDEO,
    **_FLOW,
    **_ENCODERS,
    **_DECODERS,
    **_SEQ2SEQS,
    **_VISION,
    **_AUDIO,
    **DIFFUSION,
    **_GRACE,
}
