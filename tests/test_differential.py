"""The differential harness without a GPU: the shrinker, the input makers, the report on hand-made rows, the CLI,
and (marked ``zoo``) every model of every population built on the CPU, diagnosed by ``dry_run`` and its host copies
recorded in both grad modes, so that a library release that breaks a builder or the diagnosis is caught here before
the GPU run."""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree

from launchless.apps import cli
from launchless.apps.differential import inputs, report
from launchless.apps.differential.candidate import Candidate, Library, NotInLibraryError
from launchless.apps.differential.population import candidates, parse_shard, pick, shard
from launchless.apps.differential.rows import Entry, GradMode, Result, Status, new_row
from launchless.apps.differential.shrink import HEAD_DIM, HEADS, HIDDEN, VOCAB, layer_selection, shrink_config
from launchless.core.capture_path import pretend_capturing
from launchless.core.host_constants import recording
from launchless.diagnose.dry_run import _meta_copy, _to_meta, dry_run

# --- the shrinker ---------------------------------------------------------------------------------------------


def test_shrinker_makes_heads_divide_the_width_and_keeps_grouped_query_attention() -> None:
    shrunk = shrink_config(
        {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 10}
    )
    assert shrunk["hidden_size"] == HIDDEN and shrunk["num_attention_heads"] == HEADS
    assert shrunk["head_dim"] == HEAD_DIM and HEADS % shrunk["num_key_value_heads"] == 0
    assert shrunk["num_key_value_heads"] < HEADS  # still grouped
    assert shrink_config({"num_attention_heads": 16, "num_key_value_heads": 1})["num_key_value_heads"] == 1


def test_shrinker_cuts_per_layer_lists_keeping_one_layer_of_every_kind() -> None:
    kinds = ["sliding"] * 5 + ["full"] + ["sliding"] * 5 + ["full"]
    shrunk = shrink_config({"num_hidden_layers": 12, "layer_types": kinds, "window": {"5": 1, "6": 2}})
    assert shrunk["num_hidden_layers"] == len(shrunk["layer_types"]) == 2
    assert set(shrunk["layer_types"]) == {"sliding", "full"}
    assert layer_selection(["a", "a", "b", "c"], 3) == [0, 2, 3]


def test_shrinker_keeps_every_per_stage_list_of_a_staged_backbone_the_same_length() -> None:
    stages = {"depths": [3, 4, 6, 3], "stage_numb_of_layers": [6, 6, 6, 6], "stage_kernel_size": [3, 3, 5, 5]}
    shrunk = shrink_config({"backbone_config": {**stages, "out_indices": [2, 3, 4]}})["backbone_config"]
    assert {k: len(shrunk[k]) for k in stages} == {k: 4 for k in stages}
    assert shrunk["stage_numb_of_layers"] == [6, 6, 6, 6]  # a count per stage, not indices of layers


def test_shrinker_ties_sizes_equal_to_a_width_to_the_shrunk_width() -> None:
    shrunk = shrink_config({"audio_config": {"hidden_size": 512}, "head_config": {"audio_hidden_size": 512}})
    assert shrunk["head_config"]["audio_hidden_size"] == shrunk["audio_config"]["hidden_size"] == HIDDEN


def test_shrinker_keeps_token_ids_inside_the_smaller_vocabulary_and_distinct() -> None:
    shrunk = shrink_config({"vocab_size": 152000, "eos_token_id": 151645, "image_token_id": 151655, "pad_token_id": 0})
    assert shrunk["vocab_size"] == VOCAB
    assert {shrunk["eos_token_id"], shrunk["image_token_id"]} < set(range(VOCAB))
    assert shrunk["eos_token_id"] != shrunk["image_token_id"] and shrunk["pad_token_id"] == 0


def test_shrinker_walks_sub_configs_experts_and_rope_sections() -> None:
    shrunk = shrink_config(
        {
            "text_config": {
                "hidden_size": 2048,
                "num_attention_heads": 16,
                "head_dim": 128,
                "num_local_experts": 128,
                "num_experts_per_tok": 8,
                "rope_parameters": {"mrope_section": [16, 24, 24]},
            },
            "vision_config": {"hidden_size": 1280, "depth": 32, "num_heads": 16},
        }
    )
    text = shrunk["text_config"]
    assert text["num_local_experts"] == 4 and text["num_experts_per_tok"] == 2
    assert sum(text["rope_parameters"]["mrope_section"]) == HEAD_DIM // 2
    assert shrunk["vision_config"]["hidden_size"] == HIDDEN


def test_shrinker_keeps_an_attention_layer_in_a_hybrid_decoder_whose_layers_are_all_recurrent() -> None:
    recurrent = {"num_hidden_layers": 32, "num_attention_heads": 32, "mamba_d_state": 256}
    shrunk = shrink_config({**recurrent, "layer_types": ["linear_attention"] * 32})
    assert shrunk["layer_types"] == ["linear_attention", "full_attention"]
    assert shrink_config({**recurrent, "attn_layer_indices": None})["attn_layer_indices"] == [1]
    assert shrink_config({**recurrent, "attn_layer_indices": [9, 18]})["attn_layer_indices"] != [1]


def test_shrinker_keeps_two_layers_of_every_kind_when_asked() -> None:
    kinds = ["linear_attention"] * 5 + ["hybrid"] + ["linear_attention"] * 5 + ["hybrid"]
    shrunk = shrink_config({"num_hidden_layers": 12, "layers_block_type": kinds}, per_kind=2)
    assert shrunk["num_hidden_layers"] == 4
    assert sorted(shrunk["layers_block_type"]) == ["hybrid"] * 2 + ["linear_attention"] * 2


def test_shrinker_keeps_the_parts_of_the_stack_adding_up_to_the_layer_count() -> None:
    kinds = ["sliding", "full"] * 36
    parts = {"n_input_layers": 16, "n_recurrent_layers": 40, "n_output_layers": 16}
    shrunk = shrink_config({"num_hidden_layers": 72, "layer_types": kinds, **parts}, per_kind=2)
    assert sum(shrunk[k] for k in parts) == shrunk["num_hidden_layers"] == 4
    assert all(shrunk[k] >= 1 for k in parts) and shrunk["n_recurrent_layers"] == 2


def test_shrinker_shrinks_a_layer_override_together_with_what_it_overrides() -> None:
    """A sliding layer's head is its own no-rope part plus the config's rope part: it stays their sum."""
    config = {"num_hidden_layers": 4, "num_attention_heads": 64, "head_dim": 256, "qk_nope_head_dim": 128,
              "qk_rope_head_dim": 64, "layer_types": ["full", "sliding", "full", "sliding"],
              "per_layer_config": {"1": {"qk_nope_head_dim": 192}, "3": {"qk_nope_head_dim": 192}}}  # fmt: skip
    shrunk = shrink_config(config)
    (override,) = shrunk["per_layer_config"].values()
    assert override["head_dim"] == override["qk_nope_head_dim"] + shrunk["qk_rope_head_dim"] <= HEAD_DIM
    assert shrunk["head_dim"] == shrunk["qk_rope_head_dim"]  # the config's own head was not the sum: rope part


def test_sizes_a_config_derives_are_derived_again_from_the_shrunk_sizes() -> None:
    """HRM-Text derives its per-stack layer count and the number of attention calls from the layer count."""
    transformers = pytest.importorskip("transformers")
    from launchless.apps.differential.hf import _config

    config = _config(transformers.HrmTextConfig, transformers.HrmTextForCausalLM)
    assert config.num_layers_per_stack <= 4
    assert config.num_hidden_layers == config.num_layers_per_stack * config.H_cycles * (config.L_cycles + 1)


def test_shrinker_ties_a_staged_encoders_output_width_to_the_text_width_and_keeps_its_own() -> None:
    config = {"text_config": {"hidden_size": 8192, "num_attention_heads": 64},
              "audio_config": {"hidden_sizes": [256, 2048], "hidden_size": 8192, "out_hidden_size": 8192}}  # fmt: skip
    audio = shrink_config(config)["audio_config"]
    assert audio["out_hidden_size"] == HIDDEN and audio["hidden_size"] == 8192 and audio["hidden_sizes"] == [256, 2048]


def test_shrinker_gives_rope_sections_of_the_shrunk_head_when_asked() -> None:
    config = {"hidden_size": 2560, "num_attention_heads": 20, "rope_parameters": {"rope_type": "default"}}
    assert "mrope_section" not in shrink_config(config)["rope_parameters"]
    sections = shrink_config(config, rope_sections=True)["rope_parameters"]["mrope_section"]
    assert sum(sections) == HEAD_DIM // 2 and sections[0] == sections[1]


def test_transformers_architectures_build_small_from_their_own_config_class() -> None:
    pytest.importorskip("transformers")
    from launchless.apps.differential.hf import build_architecture

    built = build_architecture("llama", "LlamaForCausalLM")
    assert built.model.config.hidden_size <= 256 and built.model.config.vocab_size <= 4096
    (_, kwargs) = built.make_inputs(torch.Generator().manual_seed(0), "cpu")
    assert set(kwargs) == {"input_ids", "attention_mask"} and int(kwargs["input_ids"].max()) < VOCAB


# --- the input makers ------------------------------------------------------------------------------------------


def test_inputs_are_fresh_on_every_call_and_reproducible_per_seed() -> None:
    generator = torch.Generator().manual_seed(1)
    first, second = inputs.smooth_images(generator, 2, 3, 64, 80), inputs.smooth_images(generator, 2, 3, 64, 80)
    assert first.shape == (2, 3, 64, 80) and not torch.equal(first, second)
    assert torch.equal(first, inputs.smooth_images(torch.Generator().manual_seed(1), 2, 3, 64, 80))
    assert float(first.min()) >= 0 and float(first.max()) <= 1


def test_detector_images_are_smooth_fields_not_white_noise() -> None:
    images = inputs.image_list(torch.Generator().manual_seed(0), 2, 320, 416)
    assert [tuple(i.shape) for i in images] == [(3, 320, 416)] * 2
    image = images[0]
    neighbours = (image[:, :, 1:] - image[:, :, :-1]).abs().mean()
    noise = torch.rand(3, 320, 416)
    assert neighbours < 0.1 * (noise[:, :, 1:] - noise[:, :, :-1]).abs().mean()


def test_video_flow_text_and_audio_inputs_have_the_shapes_models_take() -> None:
    generator = torch.Generator().manual_seed(0)
    assert inputs.video_clip(generator, 1, 16, 112).shape == (1, 3, 16, 112, 112)
    first, second = inputs.image_pair(generator, 1, 128, 160)
    assert first.shape == second.shape == (1, 3, 128, 160) and not torch.equal(first, second)
    ids = inputs.token_ids(generator, 2, 16, 1000)
    assert ids.shape == (2, 16) and int(ids.min()) > 0 and int(ids.max()) < 500
    assert inputs.waveform(generator, 2, 8000).shape == (2, 8000)


def test_matchers_get_two_views_of_one_scene() -> None:
    pairs = inputs.view_pairs(torch.Generator().manual_seed(0), 2, 3, 64, 80)
    assert pairs.shape == (2, 2, 3, 64, 80) and float(pairs.min()) >= 0 and float(pairs.max()) <= 1
    assert not torch.equal(pairs[:, 0], pairs[:, 1])
    assert any(torch.equal(pairs[:, 0, ..., s:], pairs[:, 1, ..., : 80 - s]) for s in range(1, 8))  # shifted


def test_native_resolution_towers_get_their_image_as_a_grid_of_patches() -> None:
    """Patches row by row, each patch's pixels channel-last, the grid beside them (a Siglip2 processor's layout)."""
    from types import SimpleNamespace

    from launchless.apps.differential.hf_inputs import BATCH, _patched_pixels

    config = SimpleNamespace(patch_size=4, num_channels=3, num_patches=16)
    patches, grid = _patched_pixels(config, torch.Generator().manual_seed(0))
    assert patches.shape == (BATCH, 16, 4 * 4 * 3) and grid.tolist() == [[4, 4]] * BATCH
    images = inputs.normalized_images(torch.Generator().manual_seed(0), BATCH, 3, 16, 16)
    assert torch.equal(patches[:, 1].reshape(BATCH, 4, 4, 3), images[:, :, :4, 4:8].permute(0, 2, 3, 1))


def test_compound_scaled_convnets_scale_their_coefficient_and_widths_together() -> None:
    shrunk = shrink_config({"width_coefficient": 2.0, "depth_coefficient": 3.1, "out_channels": [16, 320],
                            "hidden_dim": 2560})  # fmt: skip
    assert shrunk["width_coefficient"] * 320 == HIDDEN and shrunk["depth_coefficient"] == 1.0
    assert shrunk["hidden_dim"] == 2560 * shrunk["width_coefficient"] / 2.0


def test_dicts_keyed_by_counts_other_than_layers_are_kept() -> None:
    shrunk = shrink_config({"projector_patch_to_query_dict": {"1225": 128, "4900": 256}, "text_config": {}})
    assert shrunk["projector_patch_to_query_dict"] == {"1225": 128, "4900": 256}


def test_speech_encoders_are_tried_with_stacked_frames_and_dual_encoders_with_every_modality() -> None:
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from launchless.apps.differential.hf_inputs import Layout, _layouts

    config = SimpleNamespace(to_dict=lambda: {"num_mel_bins": 80})
    audio = _layouts(config, ("input_features!",))
    assert audio[0] == Layout(time_major=False, mels=80) and Layout(time_major=True, mels=320) in audio
    both = _layouts(config, ("input_ids", "attention_mask", "input_features"))
    assert both[: len(audio)] == audio and all(layout.every_modality for layout in both[len(audio) :])


def test_ids_stay_inside_the_smallest_vocabulary_and_parallel_streams_get_one_column_each() -> None:
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from launchless.apps.differential.hf_inputs import Layout, make_inputs

    tree = {"encoder_config": {"vocab_size": 256}, "decoder_config": {"vocab_size": 1028}}
    config = SimpleNamespace(to_dict=lambda: tree)
    _, kwargs = make_inputs(("input_ids!", "attention_mask"), config, torch.Generator().manual_seed(0), "cpu")
    assert int(kwargs["input_ids"].max()) < 256
    streams = Layout(streams=33)
    _, kwargs = make_inputs(("input_ids!", "attention_mask"), config, torch.Generator(), "cpu", layout=streams)
    assert kwargs["input_ids"].shape[-1] == 33 and kwargs["attention_mask"].shape == kwargs["input_ids"].shape[:2]


def test_shrinker_keeps_codebook_ranges_of_the_vocabulary_inside_the_shrunk_vocabulary() -> None:
    """Apertus 1.5: text ids, then the visual codes, then the audio codes, all in one vocabulary."""
    config = {"text_config": {"vocab_size": 266752}, "image_token_offset": 131272, "audio_token_offset": 262344,
              "vision_config": {"codebook_size": 131072}, "audio_config": {"codebook_size": 4096},
              "image_token_id": 131079}  # fmt: skip
    shrunk = shrink_config(config)
    image, audio = shrunk["image_token_offset"], shrunk["audio_token_offset"]
    assert image + shrunk["vision_config"]["codebook_size"] == audio
    assert audio + shrunk["audio_config"]["codebook_size"] <= shrunk["image_token_id"] < VOCAB


def test_shrinker_keeps_a_bottleneck_narrower_than_the_width_and_ties_two_widths_side_by_side() -> None:
    adaptor = shrink_config({"adaptor_config": {"hidden_size": 1024, "intermediate_size": 256}})["adaptor_config"]
    assert adaptor["intermediate_size"] == HIDDEN // 4
    codec = shrink_config({"hidden_size": 1024, "semantic_config": {"hidden_size": 1024}, "quantization_dim": 2048})
    assert codec["quantization_dim"] == 2 * HIDDEN


def test_models_with_inputs_of_their_own_get_them_fresh_and_consistent() -> None:
    """Region features and boxes (LXMERT), images packed as one row of patches with their grids (MiniCPM-V), a set
    of images with the text positions that see them (IDEFICS), Kosmos-2's image slots, a codec decoder's ids one
    column per codebook (Dia), states for a bare speech encoder-decoder (SpeechT5)."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from launchless.apps.differential.hf_inputs import BATCH, PACKED_SIDE, REGIONS, Layout, make_inputs

    def made(wanted: tuple[str, ...], layout: Layout | None = None, seed: int = 0, **config: object) -> dict:
        tree = SimpleNamespace(to_dict=lambda: {}, **config)
        return make_inputs(wanted, tree, torch.Generator().manual_seed(seed), "cpu", layout=layout or Layout())[1]

    regions = made(("input_ids", "visual_feats", "visual_pos"), visual_feat_dim=64, visual_pos_dim=4)
    assert regions["visual_feats"].shape == (BATCH, REGIONS, 64) and float(regions["visual_feats"].min()) >= 0
    boxes = regions["visual_pos"]
    assert bool((boxes[..., :2] <= boxes[..., 2:]).all()) and float(boxes.min()) >= 0 and float(boxes.max()) <= 1
    again = made(("input_ids", "visual_feats", "visual_pos"), seed=1, visual_feat_dim=64, visual_pos_dim=4)
    assert not torch.equal(regions["visual_feats"], again["visual_feats"])

    packed = made(("pixel_values!", "target_sizes"), patch_size=4, num_channels=3)
    assert packed["pixel_values"].shape == (1, 3, 4, BATCH * PACKED_SIDE**2 * 4)
    assert packed["target_sizes"].tolist() == [[PACKED_SIDE, PACKED_SIDE]] * BATCH

    sets = made(("input_ids", "pixel_values", "image_attention_mask"), Layout(every_modality=True, image_sets=True))
    assert sets["pixel_values"].shape[:2] == (BATCH, 1) and sets["image_attention_mask"].shape == (BATCH, 16, 1)

    slotted = ("input_ids", "attention_mask", "pixel_values", "image_embeds_position_mask")
    slots = made(slotted, Layout(every_modality=True), latent_query_num=8)
    assert slots["input_ids"].shape == slots["image_embeds_position_mask"].shape == slots["attention_mask"].shape
    assert slots["image_embeds_position_mask"].sum(1).tolist() == [8] * BATCH

    decoder = SimpleNamespace(vocab_size=1024, num_channels=9)
    codes = made(("input_ids", "decoder_input_ids"), Layout(decoder_streams=9), is_encoder_decoder=True,
                 decoder_config=decoder)  # fmt: skip
    assert codes["decoder_input_ids"].shape[::2] == (BATCH, 9)

    bare = ("input_values", "decoder_input_values")
    states = made(bare, Layout(states=True), hidden_size=32, is_encoder_decoder=True)
    assert states["input_values"].shape[::2] == states["decoder_input_values"].shape[::2] == (BATCH, 32)


def test_a_default_config_that_cannot_run_its_own_model_is_the_librarys_failure() -> None:
    """A setting the forward reads left unset everywhere; a sub-config given a misspelt setting (EdgeTAM's timm
    backbone ``archirecture``, which leaves ``architecture`` at its default)."""
    transformers = pytest.importorskip("transformers")
    from launchless.apps.differential.library_failures import _default_config_defect, _misspelt_setting

    unset = "ValueError: Could not find a `sliding_window` argument in the config, or it is not set"
    assert "`sliding_window` unset" in (_default_config_defect(transformers.LlamaConfig, unset) or "")
    assert _default_config_defect(transformers.MistralConfig, unset) is None  # its default sets a window
    assert _default_config_defect(transformers.LlamaConfig, "RuntimeError: shapes do not match") is None
    misspelt = transformers.TimmWrapperConfig(archirecture="repvit_m1")
    assert "`archirecture`" in (_misspelt_setting(misspelt) or "")
    assert _misspelt_setting(transformers.TimmWrapperConfig()) is None


# --- population picks -------------------------------------------------------------------------------------------


def _fake(name: str) -> Candidate:
    return Candidate(Library.TIMM, name, "classification", lambda device: None)  # type: ignore[arg-type,return-value]


def test_shards_cover_the_population_once_and_names_pick_models() -> None:
    population = [_fake(f"m{i}") for i in range(10)]
    shards = [shard(population, i, 3) for i in range(1, 4)]
    assert sorted(c.name for s in shards for c in s) == sorted(c.name for c in population)
    assert parse_shard("3/8") == (3, 8)
    with pytest.raises(ValueError):
        shard(population, 4, 3)
    assert [c.name for c in pick(population, ["m3", "timm:m1"])] == ["m3", "m1"]
    with pytest.raises(KeyError):
        pick(population, ["nope"])


# --- the report on hand-made rows -------------------------------------------------------------------------------


def _row(model: str, status: Status, result: Result | None, speedup: float | None, **extra) -> dict:
    return new_row(model, "timm", "classification", Entry.WRAP_AUTO, GradMode.NO_GRAD, status=status, result=result,
                   speedup=speedup, **extra)  # fmt: skip


def test_report_counts_rows_and_judges_every_target() -> None:
    good = [_row(f"ok{i}", Status.GRAPH, Result.IDENTICAL, 2.0, timed_alone=True) for i in range(40)]
    rows = [*good, _row("nolib", Status.NOT_RUN, Result.NOT_IN_LIBRARY, None, reason="needs scipy")]
    met = {t.name: t.met for t in report.targets(rows)}
    assert all(met.values()), met
    rows += [
        _row("bad", Status.GRAPH, Result.DIFFERS, 2.0, reason="max diff 1"),
        _row("boom", Status.GRAPH, Result.CRASH, None, reason="RuntimeError: x"),
        _row("slow", Status.SPLIT, Result.IDENTICAL, 0.9, timed_alone=True),
    ]
    judged = {t.name: t for t in report.targets(rows)}
    assert [t.met for t in judged.values()] == [False, False, False, True]
    assert judged["0 crashes where eager works"].value == "1"
    text = report.markdown(rows)
    for name in ("bad", "boom", "nolib", "needs scipy", "RuntimeError: x"):
        assert name in text
    assert "ok1 " not in text  # identical rows are counted, not listed
    assert "| wrap-auto | 41 | 43 | 95.3% |" in text  # per entry: 40 good + "slow" (a split, identical) of 43 built


def test_only_speed_ups_timed_alone_judge_the_speed_target() -> None:
    """A speed-up taken beside other workers is not a timing: the target reads the timing pass, and an accelerated
    auto row it did not time leaves the target unmet."""
    speed = "none slower than eager by > 3 % (timed alone)"
    rows = [_row("a", Status.GRAPH, Result.IDENTICAL, 0.5), _row("b", Status.GRAPH, Result.IDENTICAL, 3.0)]
    judged = {t.name: t for t in report.targets(rows)}[speed]
    assert not judged.met and judged.value == "0 of 0 rows timed alone; 2 accelerated auto rows not timed"
    line = {"key": "a", "library": "timm", "timings": [{"entry": "wrap-auto", "grad_mode": "no_grad",
            "eager_ms": 2.0, "accelerated_ms": 1.0, "speedup": 2.0}]}  # fmt: skip
    timed = report.apply_timings(rows, {("timm", "a"): line})
    assert [(r["speedup"], r["timed_alone"]) for r in timed] == [(2.0, True), (3.0, False)]
    assert {t.name: t for t in report.targets(timed)}[speed].value.startswith("0 of 1 rows timed alone; 1 ")
    line["timings"].append({"entry": "wrap-auto", "grad_mode": "inference_mode", "error": "RuntimeError: x"})
    assert report.apply_timings(rows[:1], {("timm", "a"): line})[0]["timed_alone"]


def test_a_row_slower_alone_is_listed_with_what_auto_ran_alone() -> None:
    """The timing pass's own status (auto's speed judgements alone may differ from beside other workers) comes with
    the row, and the report lists every row slower than eager by more than 3 % with it."""
    rows = [_row("slow", Status.EAGER, Result.IDENTICAL, 1.0), _row("fast", Status.GRAPH, Result.IDENTICAL, 3.0)]
    timings = {
        ("timm", name): {"key": name, "library": "timm", "timings": [{"entry": "wrap-auto", "grad_mode": "no_grad",
                         "eager_ms": 10.0, "accelerated_ms": ms, "speedup": round(10.0 / ms, 3), "status": status}]}
        for name, ms, status in (("slow", 11.0, "split"), ("fast", 2.0, "graph"))
    }  # fmt: skip
    timings["timm", "slow"]["timings"][0]["eager_spread"] = 0.02
    timed = report.apply_timings(rows, timings)
    assert [(r["timed_status"], r["speedup"]) for r in timed] == [("split", 0.909), ("graph", 5.0)]
    text = report.markdown(timed)
    assert "## Rows timed alone below 0.97x eager (1)" in text
    assert "| timm | slow | wrap-auto | no_grad | split | 0.909 | 0.02 | no | yes | 10.0 | 11.0 |" in text
    assert "| timm | fast |" not in text
    speed = "none slower than eager by > 3 % (timed alone)"
    assert not {t.name: t for t in report.targets(timed)}[speed].met


def test_the_status_alone_and_the_worse_result_of_the_two_runs_make_the_row() -> None:
    """Beside other workers, "auto" judged a split slower than eager; alone it kept it: the row is what a user alone
    on the GPU gets (a split, counted accelerated), the other status kept and listed. A difference or a crash in
    either run stands, and the calls of both count."""
    rows = [
        _row("judged", Status.EAGER, Result.IDENTICAL, None, calls=8, identical_calls=8, reason="split dropped"),
        _row("worse", Status.GRAPH, Result.IDENTICAL, None, calls=8, identical_calls=8),
        _row("crashed", Status.GRAPH, Result.IDENTICAL, None, calls=8, identical_calls=8),
        _row(
            "untouched",
            Status.GRAPH,
            Result.BOUNDED,
            None,
            calls=8,
            identical_calls=5,
            max_abs_diff=1e-7,
            bound=1e-5,
            bound_class="capture-path",
        ),
    ]
    timing = {"entry": "wrap-auto", "grad_mode": "no_grad", "eager_ms": 10.0, "accelerated_ms": 5.0, "speedup": 2.0}
    timings = {
        ("timm", "judged"): [{**timing, "status": "split", "result": "identical", "calls": 8, "identical_calls": 8}],
        ("timm", "worse"): [{**timing, "status": "graph", "result": "differs", "calls": 8, "identical_calls": 6,
                             "max_abs_diff": 0.5, "reason": "stale input"}],
        ("timm", "crashed"): [{"entry": "wrap-auto", "grad_mode": "no_grad", "status": "graph", "result": "crash",
                               "reason": "RuntimeError: boom", "calls": 2, "identical_calls": 2}],
        ("timm", "untouched"): [{**timing, "status": "graph", "result": "identical", "calls": 8,
                                 "identical_calls": 8}],
    }  # fmt: skip
    lines = {key: {"key": key[1], "library": "timm", "timings": t} for key, t in timings.items()}
    eager_failed = {"entry": "wrap-auto", "grad_mode": "no_grad", "status": "not-run", "result": "eager-fails"}
    kept = _row("kept", Status.GRAPH, Result.IDENTICAL, None, calls=8, identical_calls=8)
    (same,) = report.apply_timings(
        [kept], {("timm", "kept"): {"key": "kept", "library": "timm", "timings": [eager_failed]}}
    )
    assert (same["status"], same["result"], same["calls"]) == ("graph", "identical", 8)  # eager's own failure alone
    judged, worse, crashed, untouched = report.apply_timings(rows, lines)
    assert (judged["status"], judged["status_beside_others"], judged["result"]) == ("split", "eager", "identical")
    assert judged["reason"] is None and (judged["calls"], judged["identical_calls"]) == (16, 16)
    assert (worse["result"], worse["max_abs_diff"], worse["reason"]) == ("differs", 0.5, "stale input")
    assert "status_beside_others" not in worse
    assert (crashed["result"], crashed["reason"], crashed["timed_alone"]) == ("crash", "RuntimeError: boom", False)
    assert (untouched["result"], untouched["max_abs_diff"], untouched["identical_calls"]) == ("bounded", 1e-7, 13)
    assert sum(report.accelerated_and_verified(r) for r in (judged, worse, crashed, untouched)) == 2
    text = report.markdown([judged, worse, crashed, untouched])
    assert "## Rows that ran otherwise alone than beside other workers (1)" in text
    assert "| timm | judged | wrap-auto | no_grad | eager | split |  |" in text


def test_cuda_graph_true_refused_beside_others_but_split_alone_takes_the_split_and_back() -> None:
    """``cuda_graph=True``'s split judged slower beside other workers (refused, no result) and faster alone: the row
    is the split with its verified result; the other way round, the refusal alone stands -- unless the other run
    saw a wrong value, which always stands."""
    refused = {"status": "refused", "result": None, "reason": "CaptureError: x", "calls": 0, "identical_calls": 0}
    split = {"status": "split", "result": "identical", "calls": 8, "identical_calls": 8}
    true_row = {"entry": "wrap-true", "grad_mode": "no_grad"}

    def row(name: str, verdict: dict) -> dict:
        base = new_row(name, "timm", "classification", Entry.WRAP_TRUE, GradMode.NO_GRAD)
        return {**base, **verdict, "result": verdict["result"]}

    def line(name: str, verdict: dict) -> dict:
        return {"key": name, "library": "timm", "timings": [{**true_row, **verdict}]}

    rows = [row("now-split", refused), row("now-refused", split), row("wrong", {**split, "result": "differs"})]
    timings = {
        ("timm", "now-split"): line("now-split", split),
        ("timm", "now-refused"): line("now-refused", refused),
        ("timm", "wrong"): line("wrong", refused),
    }
    now_split, now_refused, wrong = report.apply_timings(rows, timings)
    assert (now_split["status"], now_split["result"], now_split["status_beside_others"]) == (
        "split",
        "identical",
        "refused",
    )
    assert report.accelerated_and_verified(now_split)
    assert (now_refused["status"], now_refused["result"], now_refused["reason"]) == ("refused", None, "CaptureError: x")
    assert (wrong["status"], wrong["result"]) == ("refused", "differs")


def test_the_timing_pass_runs_each_row_again_on_other_inputs_and_compares_every_call(monkeypatch) -> None:
    """Alone on the GPU the row runs again as the correctness run does -- every call compared with eager -- on
    inputs the correctness run did not draw, then it is timed."""
    from launchless.apps.differential import runner, timing

    drawn: list[torch.Tensor] = []

    def make_inputs(generator: torch.Generator, device: str) -> tuple[tuple, dict]:
        drawn.append(torch.randn(2, 4, generator=generator))
        return (drawn[-1],), {}

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    monkeypatch.setattr(
        timing, "interleaved_ms", lambda calls, **_: {name: 2.0 if "eager" in name else 1.0 for name in calls}
    )
    model = torch.nn.Linear(4, 4).eval()
    built = runner.Built(model, make_inputs, "Linear")
    candidate = Candidate(Library.TIMM, "linear", "classification", lambda device: built)
    row = runner.forward_row(candidate, built, Entry.WRAP_AUTO, GradMode.NO_GRAD, seed=5)
    correctness_inputs = list(drawn)
    drawn.clear()
    timings = timing.model_timings(candidate, built, seed=5)
    assert [(t["entry"], t["grad_mode"]) for t in timings] == [
        ("wrap-auto", "no_grad"),
        ("wrap-auto", "inference_mode"),
    ]
    for t in timings:
        assert (t["result"], t["calls"], t["identical_calls"], t["speedup"]) == (
            "identical",
            runner.CALLS,
            runner.CALLS,
            2.0,
        )
        assert t["status"] == row["status"] == "eager"  # no GPU here: wrap runs eager, and says why
    assert len(correctness_inputs) == runner.CALLS and len(drawn) == 2 * runner.CALLS
    assert not any(torch.equal(a, b) for a in correctness_inputs for b in drawn)


def test_a_reading_inside_eagers_own_spread_is_not_a_slower_row() -> None:
    """Eager timed twice in the same rounds differs from itself by ``eager_spread``: a speed-up of 0.95 where eager
    is 8 % from itself is listed, but not counted slower; outside the spread it is."""
    row = _row("noisy", Status.EAGER, Result.IDENTICAL, 0.95, timed_alone=True, eager_spread=0.08)
    assert not report.is_slower(row)
    assert report.is_slower({**row, "eager_spread": 0.01})
    assert report.is_slower({**row, "eager_spread": None})
    assert "| 0.95 | 0.08 | no | within spread |" in report.markdown([row])


def test_a_close_reading_is_measured_again_in_more_rounds(monkeypatch) -> None:
    """A first speed-up under 0.97 is not the row's verdict: it is measured again in three times the rounds, and the
    repeat's figures are kept (marked ``repeated``); a reading above it is kept as it is. Each side runs twice a
    round, alternating: its figure is the mean of its two medians."""
    from launchless.apps.differential import timing

    readings = iter([(10.0, 11.0), (10.0, 11.0), (10.0, 10.1), (10.0, 10.0)])  # (eager, accelerated) per measure
    seen: list[tuple[int, list[str], int]] = []

    def fake(calls, *, waited, rounds: int, per_round: int, rotate_by: int):
        eager, accelerated = next(readings)
        seen.append((rounds, list(calls), rotate_by))
        return {
            "eager": eager,
            "accelerated": accelerated,
            "eager_again": eager * 1.02,
            "accelerated_again": accelerated,
        }

    monkeypatch.setattr(timing, "interleaved_ms", fake)
    reading = timing.measured(lambda: None, lambda: None)
    assert reading["repeated"] and reading["speedup"] == 1.0 and reading["accelerated_ms"] == 10.1, reading
    assert [rounds for rounds, _, _ in seen] == [
        timing.ROUNDS,
        timing.ROUNDS,
        timing.REPEAT_ROUNDS,
        timing.REPEAT_ROUNDS,
    ]
    assert all(kinds == ["eager", "accelerated", "eager_again", "accelerated_again"] for _, kinds, _ in seen)
    assert all(rotate_by == 2 for _, _, rotate_by in seen)  # so that the two kinds alternate across rounds too
    readings = iter([(10.0, 5.0), (10.0, 4.0)])
    assert timing.measured(lambda: None, lambda: None) == {
        "eager_ms": 10.1, "accelerated_ms": 5.0, "speedup": 2.02, "measured": "back_to_back", "eager_spread": 0.0196,
        "repeated": False,
    }  # fmt: skip
    readings = iter([(80.0, 90.0), (80.0, 81.0)])  # generations, waited for: 0.898, so measured again (0.998)
    seen.clear()
    reading = timing.measured(lambda: None, lambda: None, waited_only=True)
    assert [rounds for rounds, _, _ in seen] == [timing.ROUNDS, timing.REPEAT_ROUNDS] and reading["speedup"] == 0.998
    assert reading["measured"] == "waited" and reading["repeated"], reading


def test_interleaved_rounds_never_run_a_kind_right_after_itself(monkeypatch) -> None:
    """Given eager and accelerated alternately twice, rotating by two places a round keeps them alternating across
    the rounds' boundaries too: neither gets the warm code and memory of running right after itself."""
    from launchless import timing as core_timing

    class Event:
        def __init__(self, **_: object) -> None: ...
        def record(self) -> None: ...
        def synchronize(self) -> None: ...
        def elapsed_time(self, _: object) -> float:
            return 1.0

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *_: None)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    ran: list[str] = []
    calls = {name: (lambda name=name: ran.append(name.split("_")[0])) for name in (
        "eager", "accelerated", "eager_again", "accelerated_again"
    )}  # fmt: skip
    core_timing.interleaved_ms(calls, waited=False, rounds=6, rotate_by=2)
    timed = ran[len(calls) :]  # after one warm call each
    assert len(timed) == 24 and all(a != b for a, b in itertools.pairwise(timed))
    ran.clear()
    core_timing.interleaved_ms(calls, waited=False, rounds=6)  # rotating by one, a kind follows itself
    assert any(a == b for a, b in itertools.pairwise(ran[len(calls) :]))


def test_bounded_rows_name_their_class_and_bound() -> None:
    row = _row("noisy", Status.GRAPH, Result.BOUNDED, 1.5, bound_class="eager-noise", max_abs_diff=1e-7, bound=1e-5)
    assert "eager-noise: max diff 1e-07 within bound 1e-05" in report.markdown([row])


def test_merge_writes_json_markdown_and_chart(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    shard_dir = tmp_path / "shard"
    shard_dir.mkdir()
    line = {"key": "ok", "rows": [_row("ok", Status.GRAPH, Result.IDENTICAL, 2.0)]}
    (shard_dir / "rows-timm-1of1-p0-0.jsonl").write_text(json.dumps(line) + "\n")
    assert cli.main(["differential", "merge", str(shard_dir), "--out", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "differential.json").read_text())
    assert [r["model"] for r in rows] == ["ok"] and set(rows[0]) >= {"model", "library", "entry", "grad_mode"}
    assert (tmp_path / "out" / "differential.png").stat().st_size > 0


def test_cli_lists_a_shard_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torchvision")
    assert cli.main(["differential", "run", "--library", "torchvision", "--shard", "2/40", "--out", "x", "--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed and len(listed) <= 4


# --- every model of every population, built on the CPU and diagnosed ------------------------------------------

# Architectures the harness cannot make small or feed yet (the build or the eager forward on its inputs raises), by
# name: a new one failing is a regression.
HARNESS_GAPS: frozenset[str] = frozenset()
NOT_IN_LIBRARY_SHARE = 0.1  # the library's own failures must stay few


def _population() -> list[Candidate]:
    found: list[Candidate] = []
    for library in Library:
        try:
            found += candidates(library)
        except ImportError:
            continue
    return found


POPULATION = _population()


# Models whose eager forward is not run on the CPU for a reason outside the harness, by name, with the reason.
EAGER_NOT_ON_CPU: dict[str, str] = {}
# Tasks whose eager forward is not run on the CPU: the model itself resizes every image to 800 pixels, which takes
# 20-60 s a forward on a 2-core CPU (the GPU run feeds them; the build, inputs and dry run are still checked here).
EAGER_NOT_ON_CPU_TASKS: dict[tuple[Library, str], str] = {
    (Library.TORCHVISION, "detection"): "resizes its images to 800 px inside the model: too slow for a CPU check",
}
EAGER_NOT_ON_CPU_MOST = 8  # the list must stay small


def _host_copies_on_meta(model: torch.nn.Module, args: tuple, kwargs: dict, grad_mode) -> list | str:
    """The host-to-device copies a capture's warm-up records (``host_constants``), with ``meta`` for the GPU: per
    copy the operation, the operand, and the host value -- or what the forward raised on ``meta``."""
    meta_args, meta_kwargs = pytree.tree_map(_to_meta, (args, kwargs))
    try:
        with grad_mode(), pretend_capturing(), recording() as recorder:
            model(*meta_args, **meta_kwargs)
    except Exception as exc:
        return type(exc).__name__
    copies = recorder.copies
    return [
        (op, source.dtype, tuple(source.shape), source.reshape(-1).view(torch.uint8).numpy().tobytes())
        for op, source in zip(copies.ops, copies.sources, strict=True)
    ]


@pytest.mark.zoo
@pytest.mark.parametrize("candidate", POPULATION, ids=[c.key for c in POPULATION])
def test_every_model_of_every_population_builds_and_runs_eager_on_the_cpu(candidate: Candidate) -> None:
    """Built, fed twice with inputs of one structure, diagnosed by ``dry_run``, and run once eager on its fresh
    inputs: an input the model does not accept would make every GPU row of it ``eager-fails``. The host copies a
    capture would make constants of are the same under ``no_grad`` and ``inference_mode`` (under the latter a
    dispatch mode sees operations made of others whole: a move inside ``type_as`` was missed)."""
    try:
        built = candidate.build("meta" if candidate.huge else "cpu")
    except NotInLibraryError as exc:
        pytest.skip(f"does not build in the library itself: {exc}")
    except Exception as exc:
        if candidate.key in HARNESS_GAPS:
            pytest.xfail(f"known harness gap: {exc}")
        raise
    args, kwargs = built.make_inputs(torch.Generator().manual_seed(0), "cpu")
    again = built.make_inputs(torch.Generator().manual_seed(1), "cpu")
    assert torch.utils._pytree.tree_structure((args, kwargs)) == torch.utils._pytree.tree_structure(again)
    dry_run(built.model, args, kwargs)  # returns the first blocker or None; raising is the failure
    on_meta, grad_modes = _meta_copy(built.model), (torch.no_grad, torch.inference_mode)
    for mode in grad_modes:  # warmed up as a capture is: what a forward keeps (ConViT's relative indices, anchors
        _host_copies_on_meta(on_meta, args, kwargs, mode)  # in transformers' caches) is not built again after
    copies = {mode: _host_copies_on_meta(on_meta, args, kwargs, mode) for mode in grad_modes}
    assert copies[torch.no_grad] == copies[torch.inference_mode], "the capture would make other constants per grad mode"
    skipped = EAGER_NOT_ON_CPU.get(candidate.key) or EAGER_NOT_ON_CPU_TASKS.get((candidate.library, candidate.task))
    if candidate.huge or skipped:
        return  # built on ``meta`` (its real-size weights are huge) or named above: no eager forward here
    try:
        with torch.inference_mode():
            built.model(*again[0], **again[1])
    except Exception as exc:
        if candidate.key in HARNESS_GAPS:
            pytest.xfail(f"known harness gap: {type(exc).__name__}: {exc}")
        raise
    assert candidate.key not in HARNESS_GAPS, "listed in HARNESS_GAPS but builds and runs eager: remove it there"


def test_the_models_not_run_eager_on_the_cpu_stay_few() -> None:
    assert len(EAGER_NOT_ON_CPU) + len(EAGER_NOT_ON_CPU_TASKS) <= EAGER_NOT_ON_CPU_MOST
    assert all(EAGER_NOT_ON_CPU.values()) and all(EAGER_NOT_ON_CPU_TASKS.values())


@pytest.mark.zoo
def test_few_models_fail_to_build_in_their_own_library() -> None:
    failing: dict[str, str] = {}
    for candidate in POPULATION:
        if candidate.library is not Library.TRANSFORMERS_CAUSAL:
            continue  # the costly builds are checked per model above; the causal LMs are cheap to count here
        try:
            candidate.build("meta")
        except NotInLibraryError as exc:
            failing[candidate.name] = str(exc)
        except Exception:
            continue
    causal = sum(c.library is Library.TRANSFORMERS_CAUSAL for c in POPULATION)
    assert all(failing.values()) and len(failing) <= NOT_IN_LIBRARY_SHARE * max(causal, 1), failing


@pytest.mark.parametrize("eager_ends_too", [False, True])
def test_a_model_that_ends_its_worker_is_a_crash_row_naming_the_row_it_was_on(
    tmp_path, monkeypatch, eager_ends_too: bool
) -> None:
    """A killed or timed-out worker leaves no row of its own: the shard writes the row into its folder, with the
    entry and grad mode the worker announced last and the error its log shows after that. That row's references
    alone, nothing accelerated, run in a fresh process: where that process ends too, eager itself ended it
    (``eager-fails``), else the crash stands."""
    from launchless.apps.differential import report, shard
    from launchless.apps.differential.candidate import Library
    from launchless.apps.differential.shard import _killed
    from launchless.apps.differential.worker import RUNNING

    asked = []

    def eager_alone(library, name, entry, mode, out, *, timeout_s):
        asked.append((library, name, entry, mode, out, timeout_s))
        if eager_ends_too:
            return shard.Alone.ENDED, "torch.AcceleratorError: CUDA error: misaligned address"
        return shard.Alone.RAN_THROUGH, ""

    monkeypatch.setattr(shard, "eager_alone", eager_alone)
    log = tmp_path / "worker-x.log"
    log.write_text(
        f"{RUNNING} other wrap-auto no_grad\n{RUNNING} ssdlite generate-greedy-b4 inference_mode\n"
        "IndexKernel.cu:193: Assertion `idx >= 0 && idx < self_dim_size` failed.\n"
        "torch.AcceleratorError: CUDA error: device-side assert triggered\n"
    )
    record = tmp_path / "rows-x-killed.jsonl"
    killed = _killed(Library.TORCHVISION, {"ssdlite": "detection"}, record, log, timeout_s=77)
    killed("ssdlite", "the worker exited with code 1")
    (row,) = report.load([tmp_path])
    assert asked == [(Library.TORCHVISION, "ssdlite", "generate-greedy-b4", "inference_mode", tmp_path, 77)]
    assert (row["model"], row["entry"], row["grad_mode"]) == ("ssdlite", "generate-greedy-b4", "inference_mode")
    if eager_ends_too:
        assert row["result"] == "eager-fails"
        assert row["reason"] == (
            "eager alone (generate-greedy-b4 / inference_mode, nothing accelerated) ends its process too: "
            "torch.AcceleratorError: CUDA error: misaligned address"
        )
    else:
        assert row["result"] == "crash"
        assert row["reason"] == (
            "the worker exited with code 1 on this model during generate-greedy-b4 / inference_mode: "
            "torch.AcceleratorError: CUDA error: device-side assert triggered; eager alone on the same inputs "
            "runs through"
        )


def test_eager_alone_that_cannot_build_the_model_leaves_the_crash_unexplained(tmp_path, monkeypatch) -> None:
    """Eager alone that ends before the model is built (out of memory beside other workers, say) proves nothing
    about eager: the crash stands, and its reason says why eager alone could not tell."""
    from launchless.apps.differential import report, shard
    from launchless.apps.differential.candidate import Library
    from launchless.apps.differential.worker import RUNNING

    def run(command, *, stdout, stderr, timeout, check):
        stdout.write("torch.OutOfMemoryError: CUDA out of memory\n")
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(shard.subprocess, "run", run)
    log = tmp_path / "worker-y.log"
    log.write_text(f"{RUNNING} m wrap-auto no_grad\ntorch.AcceleratorError: CUDA error: an illegal memory access\n")
    shard._killed(Library.TIMM, {}, tmp_path / "rows-y-killed.jsonl", log)("m", "the worker exited with code 1")
    (row,) = report.load([tmp_path])
    assert row["result"] == "crash" and row["reason"].endswith(
        "; eager alone could not build it (torch.OutOfMemoryError: CUDA out of memory)"
    ), row["reason"]


def test_a_model_that_times_out_is_a_crash_row_without_an_eager_alone_run(tmp_path, monkeypatch) -> None:
    """A worker cut off by the per-model timeout was slow, not killed: nothing to tell apart, the crash row stands."""
    from launchless.apps.differential import report, shard
    from launchless.apps.differential.candidate import Library

    monkeypatch.setattr(shard, "eager_alone", lambda *a, **k: pytest.fail("eager alone run for a timeout"))
    killed = shard._killed(Library.TIMM, {}, tmp_path / "rows-t-killed.jsonl", tmp_path / "none.log")
    killed("m", "timed out after 300 s")
    (row,) = report.load([tmp_path])
    assert (row["result"], row["reason"]) == ("crash", "timed out after 300 s on this model")


def test_a_model_that_times_out_is_charged_to_the_row_it_was_on(tmp_path, monkeypatch) -> None:
    """The row the log shows the worker on when its time ran out, not the first row of the model."""
    from launchless.apps.differential import report, shard
    from launchless.apps.differential.candidate import Library
    from launchless.apps.differential.worker import RUNNING

    monkeypatch.setattr(shard, "eager_alone", lambda *a, **k: pytest.fail("eager alone run for a timeout"))
    log = tmp_path / "worker-t.log"
    log.write_text(f"{RUNNING} m wrap-true no_grad\n{RUNNING} m wrap-true inference_mode\n")
    shard._killed(Library.TIMM, {}, tmp_path / "rows-t-killed.jsonl", log)("m", "timed out after 120 s")
    (row,) = report.load([tmp_path])
    assert (row["entry"], row["grad_mode"], row["result"]) == ("wrap-true", "inference_mode", "crash"), row
    assert row["reason"] == "timed out after 120 s on this model during wrap-true / inference_mode"


def test_a_model_run_again_replaces_its_earlier_line_whatever_the_file_names(tmp_path) -> None:
    """The merge keeps, per model, the line finished last: a killed model run again alone in the same folder (a
    worker file that sorts first) must not lose to the crash row its first worker left."""
    crash = {"key": "m", "rows": [_row("m", Status.NOT_RUN, Result.CRASH, None)], "finished_at": 100.0}
    again = {"key": "m", "rows": [_row("m", Status.GRAPH, Result.IDENTICAL, 2.0)], "finished_at": 200.0}
    (tmp_path / "rows-timm-1of1-p3-1-killed.jsonl").write_text(json.dumps(crash) + "\n")
    (tmp_path / "rows-timm-1of1-p0-2-0.jsonl").write_text(json.dumps(again) + "\n")
    assert [r["result"] for r in report.load([tmp_path])] == ["identical"]
    assert report.done_models([tmp_path]) == {("timm", "m")}


def test_mismatches_that_are_equal_numbers_are_named_and_bounded_by_zero() -> None:
    from launchless.apps.differential.runner import Mismatch, judge_mismatch, mismatch

    want = torch.tensor([1.0, 0.0, float("nan")])
    signed = torch.tensor([1.0, -0.0, float("nan")])
    payload = want.clone()
    payload.view(torch.int32)[2] ^= 1
    assert mismatch(want, signed) is Mismatch.SIGNED_ZEROS
    assert mismatch(want, payload) is Mismatch.NAN_PAYLOADS
    assert judge_mismatch(want, payload, {}) == (Result.BOUNDED, 0.0, 0.0, "NaN payloads")
    moved = torch.tensor([1.0, 1e-7, float("nan")])
    assert mismatch(want, moved) is Mismatch.VALUES
    assert judge_mismatch(want, moved, {})[0] is Result.DIFFERS
    assert mismatch((want,), (want, want)) is Mismatch.STRUCTURE
    assert mismatch({"n": 1, "t": want}, {"n": 2, "t": want}) is Mismatch.OTHER_LEAVES


def test_a_difference_names_its_leaf_and_the_report_shows_it() -> None:
    """A row that differs names the first leaf that differs, how many of its elements and the NaNs on each side, and
    the report prints it beside the reason."""
    from launchless.apps.differential.report import markdown
    from launchless.apps.differential.runner import Mismatch, differing_leaf, judge_mismatch, mismatch

    logits = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    want = {"logits": logits, "experts": torch.tensor([0, 3, 1])}
    got = {"logits": logits.clone(), "experts": torch.tensor([0, 2, 1])}
    assert mismatch(want, got) is Mismatch.VALUES
    assert judge_mismatch(want, got, {})[0] is Result.DIFFERS
    assert differing_leaf(want, got) == "['experts'] torch.int64[3] on cpu: 1 of 3 elements differ"
    nan = logits.clone()
    nan[1, 0] = float("nan")
    assert differing_leaf((logits,), (nan,)) == (
        "[0] torch.float32[2, 2] on cpu: 1 of 4 elements differ; NaN 0 in the reference, 1 accelerated"
    )
    assert differing_leaf((logits,), (logits.clone(),)) is None
    close = logits.clone()
    close[0, 1] += 2**-20  # within the rounding bound at the outputs' magnitude: judged by the pair that exceeds most
    assert judge_mismatch((logits, want["experts"]), (close, want["experts"]), {})[:2] == (Result.DIFFERS, 0.0)
    assert differing_leaf((logits,), (close,)) == (
        "[0] torch.float32[2, 2] on cpu: 1 of 4 elements differ, by at most 9.54e-07; NaN 0 in the reference, "
        "0 accelerated"
    )

    class Keyless:  # registered without key paths, as ``see_into`` registers a cache
        def __init__(self, t: torch.Tensor) -> None:
            self.t = t

    pytree.register_pytree_node(Keyless, lambda k: ([k.t], None), lambda leaves, _: Keyless(leaves[0]))
    try:
        assert differing_leaf((Keyless(logits),), (Keyless(nan),)) == (
            "leaf 0 of 1 (Tensor) torch.float32[2, 2] on cpu: 1 of 4 elements differ; NaN 0 in the reference, "
            "1 accelerated"
        )
    finally:
        pytree._deregister_pytree_node(Keyless)
    row = new_row("m", "transformers", "decoder", "compile", "no_grad", status="split", result="differs", calls=8)
    row.update(reason="runs an operation eager between graphs", differing_leaf=differing_leaf(want, got))
    assert "first difference at ['experts'] torch.int64[3] on cpu: 1 of 3 elements differ" in markdown([row])


def test_a_graph_whose_library_branches_on_capture_is_held_to_verifications_rule_on_every_call() -> None:
    """Verification names the capture-path class from the branch it recorded when its probes show a difference; a
    later call whose inputs show one is judged by the same rule, whichever probes verification drew -- and only
    within the rounding bound, and only where a branch was recorded."""
    from launchless.apps.differential.report import _bounded
    from launchless.apps.differential.runner import CAPTURE_PATH, judge_mismatch

    want = torch.linspace(1, 2, 8)
    near = want.clone()
    near[3] = torch.nextafter(near[3], torch.tensor(3.0))  # one ulp
    report = {"status": "bit-identical", "passed": True, "capture_branches": ["masking_utils.py:330"]}
    info = {"graphs": [{"verification": report}]}
    result, max_abs, bound, named = judge_mismatch(want, near, info)
    assert (result, named) == (Result.BOUNDED, CAPTURE_PATH) and 0 < max_abs <= bound
    assert judge_mismatch(want, near, {"graphs": [{"verification": {**report, "capture_branches": []}}]})[0] is (
        Result.DIFFERS
    )
    assert judge_mismatch(want, near, {"graphs": [{"verification": {**report, "passed": False}}]})[0] is Result.DIFFERS
    assert judge_mismatch(want, want * 1.01, info)[0] is Result.DIFFERS  # beyond the bound whatever branched
    row = {"bound_class": CAPTURE_PATH, "max_abs_diff": max_abs, "bound": bound, "capture_path_max_abs": max_abs}
    assert "named by the capture branch alone" in _bounded(row)
    assert "alone" not in _bounded({**row, "capture_path_max_abs": None})


def test_a_difference_that_eager_on_the_capture_path_reproduces_is_the_capture_path_class(monkeypatch) -> None:
    """transformers skips an all-ones attention mask where it may read the mask on the host, and builds it while
    capturing: a graph then differs from eager in the last bits on calls whose mask is all ones. Eager told it is
    capturing reproduces the graph bit for bit: named, on that call; anything else still differs."""
    from launchless.apps.differential.runner import CAPTURE_PATH, on_capture_path

    for owner in (torch.cuda, torch.cuda.graphs):  # no stream captures here (and no GPU to ask)
        monkeypatch.setattr(owner, "is_current_stream_capturing", lambda: False)

    def forward(x: torch.Tensor) -> torch.Tensor:
        skewed = x * (1 + 2**-22) if torch.cuda.is_current_stream_capturing() else x  # another kernel's rounding
        return skewed * 3

    x = torch.linspace(1, 2, 8)
    want = forward(x)
    with pretend_capturing():
        got = forward(x)  # what the graph captured
    assert not torch.equal(want, got)
    result, bound, named, off_path = on_capture_path(forward, want, got, 0, (x,), {})
    assert (result, named, off_path) == (Result.BOUNDED, CAPTURE_PATH, 0.0) and bound is not None and bound > 0
    other = got + 1e-6  # not what the capture path computes: how far it is, kept for the report
    result, bound, named, off_path = on_capture_path(forward, want, other, 0, (x,), {})
    assert (result, bound, named) == (Result.DIFFERS, None, None) and off_path == pytest.approx(1e-6, rel=0.1)
    far = want * 1.01  # beyond the rounding bound whatever explains it
    assert on_capture_path(lambda t: far, want, far, 0, (x,), {})[0] is Result.DIFFERS


def test_a_reference_that_differs_from_itself_has_its_spread_measured() -> None:
    from launchless.apps.differential.runner import reference_noise

    draws = iter([0.0, 3e-6, -2e-6, 1e-6])
    want = torch.ones(4)
    assert reference_noise(lambda x: x.clone(), want, 0, (want,), {}) == 0.0
    noisy = reference_noise(lambda x: x + next(draws), want, 0, (want,), {})
    assert noisy == pytest.approx(3e-6, rel=0.05)  # float32 rounding of 1 + 3e-6
    assert reference_noise(lambda x: x[:2], want, 0, (want,), {}) == float("inf")


def test_a_model_killed_in_the_timing_pass_leaves_its_correctness_rows_alone(tmp_path) -> None:
    from launchless.apps.differential.shard import _killed

    ok = {"key": "m", "rows": [_row("m", Status.GRAPH, Result.IDENTICAL, 2.0)], "finished_at": 1.0}
    (tmp_path / "rows-timm-1of1-p0-1-0.jsonl").write_text(json.dumps(ok) + "\n")
    killed = _killed(Library.TIMM, {}, tmp_path / "rows-timm-timing-killed.jsonl", tmp_path / "none.log", timing=True)
    killed("m", "timed out after 300 s")
    assert [r["result"] for r in report.load([tmp_path])] == ["identical"]
    (line,) = report.load_timings([tmp_path]).values()
    assert line["timings"] == [] and line["error"] == "timed out after 300 s on this model"
    assert report.timed_models([tmp_path]) == {("timm", "m")}


def test_a_timing_line_that_failed_for_want_of_a_package_is_timed_again_on_resume(tmp_path) -> None:
    """The worker's environment lacked the library (a machine without diffusers): nothing was learnt of the model,
    so ``--resume`` runs it again; a model that timed out stays done."""
    lines = [
        {"key": "unet", "library": "diffusers", "timings": [], "error": "ModuleNotFoundError: No module named 'x'"},
        {"key": "vae", "library": "diffusers", "timings": [], "error": "timed out after 240 s on this model"},
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (tmp_path / "rows-diffusers-timing-1of1-p0-1-0.jsonl").write_text(text)
    assert report.timed_models([tmp_path]) == {("diffusers", "vae")}


def test_the_timing_pass_runs_one_process() -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["differential", "run", "--library", "timm", "--timing", "--processes", "4", "--out", "x"])
    assert exit_.value.code == 2


def test_the_timing_pass_leaves_out_models_that_do_not_build(tmp_path) -> None:
    """Models whose correctness rows say they do not build (or that eager fails on them) have nothing to time; a model
    with no correctness rows yet is timed."""
    lines = [
        {"key": "ok", "rows": [_row("ok", Status.GRAPH, Result.IDENTICAL, 2.0)], "finished_at": 1.0},
        {"key": "gap", "rows": [_row("gap", Status.NOT_RUN, Result.HARNESS, None)], "finished_at": 1.0},
        {"key": "fails", "rows": [_row("fails", Status.NOT_RUN, Result.EAGER_FAILS, None)], "finished_at": 1.0},
    ]
    (tmp_path / "rows-timm-1of1-p0-1-0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert report.unbuilt_models([tmp_path]) == {("timm", "gap"), ("timm", "fails")}


def test_the_report_says_how_much_of_each_population_it_covers(tmp_path) -> None:
    from launchless.apps.differential.shard import write_population

    population = [Candidate(Library.TIMM, name, "classification", lambda device: None) for name in ("a", "b", "c")]
    write_population(tmp_path, Library.TIMM, population)
    populations = report.load_populations([tmp_path])
    assert populations["timm"]["models"] == ["a", "b", "c"] and populations["timm"]["torch"] == torch.__version__
    text = report.markdown([_row("a", Status.GRAPH, Result.IDENTICAL, 2.0)], populations)
    assert "| timm | " in text and "| 1 of 3 |" in text


def test_a_timm_model_whose_init_refuses_meta_is_sized_on_the_cpu(monkeypatch) -> None:
    """Some timm releases read values back in an init (a drop-path schedule's ``.tolist()``), which ``meta`` cannot
    do: the module's smallest architecture is still found, on the CPU, instead of "no architecture builds"."""
    timm = pytest.importorskip("timm")
    from launchless.apps.differential import vision

    create = timm.create_model

    def meta_refuses(*args, **kwargs):
        if torch.empty(0).device.type == "meta":
            raise RuntimeError("Cannot copy out of meta tensor; no data!")
        return create(*args, **kwargs)

    expected = vision.smallest_timm("regnet")
    monkeypatch.setattr(timm, "create_model", meta_refuses)
    assert vision.smallest_timm("regnet") == expected


def test_the_report_counts_the_rows_not_accelerated_by_entry_and_status() -> None:
    rows = [
        _row("a", Status.GRAPH, Result.IDENTICAL, 2.0),
        new_row("b", "timm", "classification", Entry.WRAP_TRUE, GradMode.NO_GRAD, status=Status.REFUSED),
        new_row("c", "timm", "classification", Entry.WRAP_TRUE, GradMode.NO_GRAD, status=Status.REFUSED),
        _row("d", Status.EAGER, Result.IDENTICAL, 1.0),
    ]
    text = report.markdown(rows)
    assert "## Rows not accelerated with a verified result, by entry and status" in text
    assert "| wrap-true | refused | None | 2 |" in text and "| wrap-auto | eager | identical | 1 |" in text
    assert "| wrap-auto | graph |" not in text


def test_the_compile_reference_is_the_accelerated_models_own_programs_without_graphs(monkeypatch) -> None:
    """A compiled row is held to the very programs the launchless backend compiled for it, run without graphs: the
    graphs must change nothing, while Inductor's kernels (configurations benchmarked at a program's first call, which
    a second compilation may pick otherwise), and the backend's own rewrites and partitions, round as they do."""
    from launchless.apps.differential import runner
    from launchless.apps.differential.rows import Entry
    from launchless.compiler import compiled_graphs

    compiled = []
    monkeypatch.setattr(runner.torch, "compile", lambda model, **kw: compiled.append(kw) or model)
    model = torch.nn.Linear(2, 2)
    assert runner.reference_of(model, Entry.WRAP_AUTO) is model and compiled == []
    inside = []

    def accelerated(x: torch.Tensor) -> torch.Tensor:
        inside.append(compiled_graphs._WITHOUT_GRAPHS.get())
        return x + 1

    reference = runner.reference_of(model, Entry.COMPILE, accelerated)
    assert torch.equal(reference(torch.zeros(2)), torch.ones(2)) and inside == [True] and compiled == []
    assert accelerated(torch.zeros(2)) is not None and inside == [True, False]
    runner.reference_of(model, Entry.COMPILE)  # no accelerated model (a reference run alone): a compilation of its own
    assert compiled == [{"backend": "launchless"}]


def test_compiled_programs_run_without_graphs_count_for_nothing() -> None:
    """Under ``without_graphs`` a compiled graph runs its program and no call is seen: the calls after it are counted
    from the first, as if the reference had not run."""
    from launchless.compiler import without_graphs
    from launchless.compiler.compiled_graphs import CompiledGraphs

    graphs = CompiledGraphs(lambda x: x * 2, frozenset(), name="graph 1", capture_after=2, selective=False)
    x = torch.ones(3)
    with without_graphs():
        for _ in range(3):
            assert torch.equal(graphs(x), x * 2)
    assert graphs.graph_info()["fallbacks"] == []  # nothing seen: a capture would have been refused (no GPU)
    graphs(x)
    assert graphs.graph_info()["fallbacks"] == []  # the first call counted: it runs compiled, nothing to capture
    graphs(x)
    (refused,) = graphs.graph_info()["fallbacks"]
    assert "not all on one CUDA device" in refused["reason"]


def test_a_run_of_some_entry_points_replaces_only_their_rows(tmp_path: Path) -> None:
    """After a change to one entry point its rows are run again alone (``--entries``): the merge lays them over the
    model's earlier rows, in their places, and leaves the other entry points' rows as the whole run left them."""

    def row(entry: Entry, mode: GradMode, status: Status) -> dict:
        return new_row("m", "timm", "classification", entry, mode, status=status, result=Result.IDENTICAL)

    full = [row(e, g, Status.GRAPH) for e in (Entry.WRAP_AUTO, Entry.WRAP_TRUE) for g in GradMode]
    again = [row(Entry.WRAP_TRUE, g, Status.SPLIT) for g in GradMode]
    lines = [
        {"key": "m", "rows": full, "finished_at": 1.0},
        {"key": "m", "rows": again, "finished_at": 2.0, "entries": ["wrap-true"]},
    ]
    (tmp_path / "rows-a.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    merged = report.load([tmp_path])
    assert [(r["entry"], r["grad_mode"], r["status"]) for r in merged] == [
        ("wrap-auto", "no_grad", "graph"), ("wrap-auto", "inference_mode", "graph"),
        ("wrap-true", "no_grad", "split"), ("wrap-true", "inference_mode", "split"),
    ]  # fmt: skip
    assert report.done_models([tmp_path], entries=["wrap-true"]) == {("timm", "m")}
    assert report.done_models([tmp_path], entries=["compile"]) == set()
    later = {"key": "m", "rows": full[:1], "finished_at": 3.0}  # a whole run again replaces everything
    (tmp_path / "rows-b.jsonl").write_text(json.dumps(later) + "\n")
    assert [r["entry"] for r in report.load([tmp_path])] == ["wrap-auto"]


def test_a_worker_killed_in_a_run_of_some_entry_points_charges_one_of_theirs(tmp_path) -> None:
    from launchless.apps.differential.shard import _killed

    record = tmp_path / "rows-x-killed.jsonl"
    line = _killed(Library.TIMM, {}, record, tmp_path / "none.log", entries=["wrap-true"])("m", "timed out after 1 s")
    assert line["entries"] == ["wrap-true"] and line["rows"][0]["entry"] == "wrap-true", line
    assert line["rows"][0]["result"] == Result.CRASH.value


def test_the_timing_pass_runs_again_only_the_entry_points_it_can(capsys) -> None:
    """Sampling and batch-4 decoding are not run again alone: asked for, the error names what the pass runs."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["differential", "run", "--library", "timm", "--timing", "--entries", "generate-sample", "--out", "x"])
    assert exited.value.code == 2
    assert "the timing pass runs again wrap-auto, wrap-true, compile, generate-greedy-b1" in capsys.readouterr().err


def test_a_timing_pass_of_some_entry_points_replaces_just_their_timings(monkeypatch, tmp_path) -> None:
    """The pass run again for wrap-true (a row refused beside other workers because of a speed judgement) keeps
    the earlier line's wrap-auto timings; resumed, a model counts as timed only with timings of the entries asked."""
    from launchless.apps.differential import timing

    auto = {"entry": "wrap-auto", "grad_mode": "no_grad", "speedup": 2.0, "status": "graph"}
    first = {"key": "a", "library": "timm", "timings": [auto], "finished_at": 1.0}
    true_ = {"entry": "wrap-true", "grad_mode": "no_grad", "speedup": 1.5, "status": "split", "result": "identical"}
    (tmp_path / "rows-timm-timing-1.jsonl").write_text(json.dumps(first) + "\n")
    assert report.timed_models([tmp_path], entries=["wrap-true"]) == set()
    second = {"key": "a", "library": "timm", "timings": [true_], "finished_at": 2.0}
    (tmp_path / "rows-timm-timing-2.jsonl").write_text(json.dumps(second) + "\n")
    (line,) = report.load_timings([tmp_path]).values()
    assert sorted(t["entry"] for t in line["timings"]) == ["wrap-auto", "wrap-true"]
    assert report.timed_models([tmp_path], entries=["wrap-true"]) == {("timm", "a")}
    ran: list[tuple[str, str]] = []
    monkeypatch.setattr(timing, "_forward_timing", lambda c, b, entry, mode, seed: ran.append((entry, mode)) or {})
    candidate = Candidate(Library.TIMM, "a", "classification", lambda device: None)
    timing.model_timings(candidate, None, 0, entries=frozenset({Entry.WRAP_TRUE, Entry.COMPILE}))
    assert ran == [
        (e, m) for e in (Entry.WRAP_TRUE, Entry.COMPILE) for m in (GradMode.NO_GRAD, GradMode.INFERENCE_MODE)
    ]


def test_a_timing_taken_before_its_row_ran_again_is_not_laid_over_it(tmp_path) -> None:
    """A model run again after a change has rows of the new code; the timing pass's line from before describes the
    code before it (its speed, and the status it ran alone): the row stands untimed until the pass times it again,
    and a timing taken after it is laid over it."""
    row = _row("m", Status.SPLIT, Result.IDENTICAL, None)
    (tmp_path / "rows-timm-1of1-p0-2-0.jsonl").write_text(
        json.dumps({"key": "m", "rows": [row], "finished_at": 2.0}) + "\n"
    )
    before = {"entry": "wrap-auto", "grad_mode": "no_grad", "status": "eager", "result": "identical", "calls": 8}
    before |= {"eager_ms": 2.0, "accelerated_ms": 2.2, "speedup": 0.9}
    timing = {"key": "m", "library": "timm", "timings": [before], "finished_at": 1.0}
    (tmp_path / "rows-timm-timing-1of1-p0-1-0.jsonl").write_text(json.dumps(timing) + "\n")
    (merged,) = report.apply_timings(report.load([tmp_path]), report.load_timings([tmp_path]))
    assert (merged["status"], merged["timed_alone"], merged["speedup"]) == ("split", False, None)
    text = report.markdown([merged])  # the report lists it, with what times it again
    assert "## Accelerated rows not yet timed alone (1)" in text and 'AGAIN="timm:m"' in text, text
    after = {
        **timing,
        "timings": [{**before, "accelerated_ms": 1.1, "speedup": 1.8, "status": "split"}],
        "finished_at": 3.0,
    }
    (tmp_path / "rows-timm-timing-1of1-p0-3-0.jsonl").write_text(json.dumps(after) + "\n")
    (merged,) = report.apply_timings(report.load([tmp_path]), report.load_timings([tmp_path]))
    assert (merged["status"], merged["timed_alone"], merged["speedup"]) == ("split", True, 1.8)


def test_rows_not_accelerated_are_counted_by_cause() -> None:
    """Where the share target loses its rows, by cause: the decoding requests a model's class declines a static cache
    for, splits not faster than eager, cuda_graph=True refusals -- each counted once, accelerated rows not at all."""
    rows = [
        _row("a", Status.EAGER, Result.IDENTICAL, None, reason="GitForCausalLM does not support a static KV cache"),
        _row("b", Status.EAGER, Result.IDENTICAL, None, reason="host sync; split dropped: not faster than eager"),
        {**_row("c", Status.REFUSED, None, None, reason="CaptureError: launchless cannot ..."), "entry": "wrap-true"},
        _row("d", Status.GRAPH, Result.IDENTICAL, 2.0),
    ]
    assert [report.cause_of(r) for r in rows[:3]] == [
        "decoding: the model's class tells transformers it has no static cache",
        "a forward that cannot be one graph, and no split of it faster than eager",
        "cuda_graph=True raised: no verified graph, and no verified split faster than eager",
    ]
    text = report.markdown(rows)
    section = text[text.index("## Rows not accelerated with a verified result, by cause") :]
    assert "| decoding: the model's class tells transformers it has no static cache | 1 |" in section
    assert section.count("| 1 |") >= 3 and "| d |" not in section.split("##")[1]


def test_the_report_lists_the_models_whose_grad_modes_ran_otherwise() -> None:
    """A capture, blocker scan or verification that depends on the grad mode is what the harness exists to catch:
    the report names each model and entry point whose two grad modes ran otherwise, with both reasons."""

    def row(model: str, entry: Entry, mode: GradMode, status: Status, reason: str | None = None) -> dict:
        return new_row(model, "transformers", "text", entry, mode, status=status, result=Result.IDENTICAL,
                       speedup=None, reason=reason)  # fmt: skip

    refusal = "CaptureError: launchless cannot capture M.forward for input (int64[2x16]@cuda:0): host sync `aten.x`"
    rows = [
        row("apart", Entry.WRAP_AUTO, GradMode.NO_GRAD, Status.GRAPH),
        row("apart", Entry.WRAP_AUTO, GradMode.INFERENCE_MODE, Status.SPLIT, "verification"),
        row("alike", Entry.WRAP_AUTO, GradMode.NO_GRAD, Status.GRAPH),
        row("alike", Entry.WRAP_AUTO, GradMode.INFERENCE_MODE, Status.GRAPH),
        row("refused", Entry.WRAP_TRUE, GradMode.NO_GRAD, Status.REFUSED, refusal),
        row("refused", Entry.WRAP_TRUE, GradMode.INFERENCE_MODE, Status.SPLIT, "host sync"),
        row("one-mode", Entry.COMPILE, GradMode.INFERENCE_MODE, Status.EAGER, "compiled code faster"),
    ]
    text = report.markdown(rows)
    section = text[text.index("## Rows whose grad modes ran otherwise (2)") :]
    assert "| transformers | apart | wrap-auto | graph | split: verification |" in section
    refused = "| transformers | refused | wrap-true | refused: CaptureError: host sync `aten.x` | split: host sync |"
    assert refused in section
    assert "alike" not in section and "one-mode" not in section


def test_a_decoding_row_names_why_no_step_replays_before_the_steps_that_waited() -> None:
    """The steps run eager before a decode shape is captured are not a cause: the row's reason starts with why none
    replays (the blocker and its line), and the report counts it under that cause."""
    from launchless.apps.differential.generate import _decode_status

    blocker = "host sync `aten._local_scalar_dense` at modeling_xglm.py:99 in forward: `if max_pos > n:`"
    info = {"decode": {"steps_replayed": 0, "steps_eager": {"captured once seen 3 times": 2, blocker: 28}}}
    status, reason = _decode_status(info)
    assert status is Status.EAGER and reason == f"{blocker}; captured once seen 3 times"
    waited = "captured once seen 3 times; the forward writes into its input"
    rows = [_row("x", Status.EAGER, Result.IDENTICAL, None, reason=reason)]
    rows.append(_row("y", Status.EAGER, Result.IDENTICAL, None, reason=waited))
    assert [report.cause_of(r) for r in rows] == [
        "decoding: a decode step syncs with the host",
        "the forward writes into its input",
    ]


def test_a_compile_row_without_a_graph_names_the_backends_first_refusal_and_its_line() -> None:
    from launchless.apps.differential.runner import status_of

    refused = [{"name": "graph 0", "graphs": [], "fallbacks": [
        {"reason": "data-dependent shape `aten.nonzero`", "source": "moe.py:12"},
    ]}]  # fmt: skip
    assert status_of(refused, Entry.COMPILE) == (
        Status.EAGER, "no verified graph in graph_info(): data-dependent shape `aten.nonzero`", "moe.py:12"
    )  # fmt: skip
    status, reason, _ = status_of([], Entry.COMPILE)
    assert status is Status.EAGER and reason is not None
    assert "Dynamo handed the launchless backend no FX graph" in reason
    passed = {"verification": {"status": "passed", "passed": True}, "variant": "graph"}
    verified = [{"name": "graph 0", "graphs": [passed], "fallbacks": []}]
    assert status_of(verified, Entry.COMPILE) == (Status.GRAPH, None, None)


def test_a_compile_row_is_split_by_its_chains_and_eager_where_every_graph_lost_to_the_compiled_code() -> None:
    """A compiled FX graph replayed as graphs around an operation run eager is a split, naming the operation and
    its line; verified graphs that the variant choice left unused ("no-graph": the compiled code alone was faster)
    are not a graph that ran."""
    from launchless.apps.differential.runner import status_of

    ok = {"status": "bit-identical", "passed": True}
    chain = {"verification": ok, "variant": "graph", "region_split": {
        "graphs": 5, "eager_ops": [{"op": "transformers::grouped_mm_fallback", "source": "moe.py:332"}] * 4,
        "reason": "transformers::grouped_mm_fallback", "source": "moe.py:332"}}  # fmt: skip
    whole = {"verification": ok, "variant": "graph+pi"}
    info = [{"name": "graph 0", "graphs": [chain], "fallbacks": []}, {"name": "graph 1", "graphs": [whole]}]
    assert status_of(info, Entry.COMPILE) == (
        Status.SPLIT, "runs transformers::grouped_mm_fallback eager between graphs", "moe.py:332"
    )  # fmt: skip
    assert status_of(info[1:], Entry.COMPILE) == (Status.GRAPH, None, None)
    unused = [{"name": "graph 0", "graphs": [{**whole, "variant": "no-graph"}], "fallbacks": []}]
    status, reason, _ = status_of(unused, Entry.COMPILE)
    assert status is Status.EAGER and reason is not None and "faster than its verified graph" in reason


def test_the_report_says_which_gpus_ran_and_timed_the_rows(tmp_path) -> None:
    """Runs of one report may come from several machines: each line names its GPU, the coverage table counts the
    rows per GPU, and a line written before lines named one counts as the GPU its library was enumerated on."""
    old = {"key": "a", "rows": [_row("a", Status.GRAPH, Result.IDENTICAL, 2.0)], "finished_at": 1.0}
    new = {"key": "b", "rows": [_row("b", Status.GRAPH, Result.IDENTICAL, 2.0)], "finished_at": 2.0, "gpu": "H100"}
    (tmp_path / "rows-timm-1of1-p0-0.jsonl").write_text(json.dumps(old) + "\n" + json.dumps(new) + "\n")
    timing = {"key": "b", "library": "timm", "gpu": "H200", "timings": [{"entry": "wrap-auto", "grad_mode": "no_grad",
              "eager_ms": 2.0, "accelerated_ms": 1.0, "speedup": 2.0}]}  # fmt: skip
    rows = report.apply_timings(report.load([tmp_path]), {("timm", "b"): timing})
    assert {r["model"]: (r["gpu"], r.get("timed_on")) for r in rows} == {"a": (None, None), "b": ("H100", "H200")}
    populations = {"timm": {"models": ["a", "b"], "version": "1", "gpu": "H200", "torch": "2.11"}}
    text = report.markdown(rows, populations)
    assert "| timm | 1 | 2 of 2 | H100 (1), H200 (1) | H200 | 2.11 |" in text, text


def test_where_no_layout_is_accepted_one_warning_names_each_layouts_failure(monkeypatch, caplog) -> None:
    """The row runs the first layout, whose failure may be a shape it got wrong; the warning shows what the others met
    (a model's own failure on the right layout: a tensor its library leaves on the host, say)."""
    from launchless.apps.differential import hf_inputs
    from launchless.apps.differential.hf_inputs import Layout, fit_layout

    layouts = [Layout(mels=80), Layout(time_major=True, mels=160)]
    monkeypatch.setattr(hf_inputs, "_layouts", lambda config, wanted: layouts)
    monkeypatch.setattr(
        hf_inputs, "make_inputs", lambda wanted, config, generator, device, *, layout: ((torch.ones(layout.mels),), {})
    )

    class Refuses(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError(f"cannot take {x.numel()} values")

    with caplog.at_level(logging.WARNING, logger="launchless"):
        assert fit_layout(Refuses(), None, ()) == layouts[0]
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("Refuses: no input layout runs its eager forward: ") and line.count("cannot take") == 2, line
    assert "time_major=True, mels=160: RuntimeError: cannot take 160 values" in line, line


def test_greedy_decoding_is_timed_under_both_grad_modes_and_a_line_of_one_is_timed_again(monkeypatch, tmp_path) -> None:
    """The correctness rows decode greedily under no_grad and inference_mode, with graphs of each: the timing pass
    times both, and resumed for decoding it runs again a model whose line has decoding under one grad mode only --
    but not a model it already ran for decoding that had nothing to decode (no generate())."""
    from types import SimpleNamespace

    from launchless.apps.differential import timing

    ran: list[GradMode] = []
    monkeypatch.setattr(timing, "_decode_timing", lambda c, b, mode, seed: ran.append(mode) or {})
    model = SimpleNamespace(model=SimpleNamespace(generate=None))
    candidate = Candidate(Library.TRANSFORMERS_CAUSAL, "lm", "causal-lm", lambda device: model)
    timing.model_timings(candidate, model, 0, entries=frozenset({Entry.GENERATE_GREEDY_B1}))
    assert ran == [GradMode.NO_GRAD, GradMode.INFERENCE_MODE]
    decode = {"entry": "generate-greedy-b1", "speedup": 2.0}
    lines = [
        {"key": "one", "library": "transformers-causal", "timings": [{**decode, "grad_mode": "inference_mode"}]},
        {"key": "both", "library": "transformers-causal", "timings": [{**decode, "grad_mode": m} for m in GradMode]},
        {"key": "none", "library": "transformers-causal", "timings": [], "entries": ["generate-greedy-b1"]},
    ]
    (tmp_path / "rows-transformers-causal-timing-1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    done = report.timed_models([tmp_path], entries=["generate-greedy-b1"])
    assert done == {("transformers-causal", "both"), ("transformers-causal", "none")}
    assert report.timed_models([tmp_path]) == {("transformers-causal", k) for k in ("one", "both", "none")}
