"""Which failures of a shrunk transformers model are the library's own, not the harness's: listed as
``not-in-library`` and not counted.

A model the harness builds from its config class with sizes shrunk, and feeds inputs read off its forward, can fail
for two kinds of reason: the harness made it or its inputs wrong (a harness defect, counted), or the library cannot
run it (reported with the reason, not counted). The second is claimed only where the library's own unshrunk default
config fails too: it does not build; it fails the same way on the harness's inputs where those inputs are the ones
every model of its kind takes; or the default config itself keeps the model from running whatever the inputs. Each
is checked on the installed library, so a release that mends it runs the model again.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable
from typing import Any

import torch

from ...errors import one_line
from .candidate import NotInLibraryError

# A forward reading an attribute its own config class does not have: the library's failure whatever the inputs
_CONFIG_LACKS = re.compile(r"AttributeError: '\w+Config' object has no attribute")
# A forward reading a setting its config leaves unset (a sliding-window mask built where no window is set)
_CONFIG_UNSET = re.compile(r"Could not find a `(\w+)` argument in the config, or it is not set")


def _setting(config: Any, name: str) -> Any:
    """``config.name``, or None where the config refuses the read (a per-layer attribute read globally)."""
    try:
        return getattr(config, name, None)
    except Exception:
        return None


def default_builds(config_cls: type, model_cls: type) -> None:
    """Raise ``NotInLibraryError`` when the unshrunk default config does not build either (tried on ``meta``)."""
    try:
        with torch.device("meta"):
            model_cls(config_cls())
    except Exception as exc:
        raise NotInLibraryError(f"its default config does not build: {one_line(exc)}") from exc


def default_runs(model: torch.nn.Module, config_cls: type, model_cls: type, make: Any, *, causal: bool) -> None:
    """Raise ``NotInLibraryError`` when the model fails on the harness's inputs and the unshrunk default config
    fails the same way on them (on ``meta``), where that failure is the library's own: a causal LM failing on ids
    and a mask -- the inputs every causal LM takes, ``generate`` feeds nothing else -- (a cache its forward cannot
    build, states it needs from another model), or any forward reading an attribute its own config class lacks.
    Other failures on the default config too may be inputs the harness does not make yet: they stay the harness's,
    unless the default config itself keeps the model from running whatever the inputs (``_default_config_defect``).
    """
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    if device.type == "meta":
        return
    args, kwargs = make(torch.Generator().manual_seed(0), device)
    try:
        with torch.inference_mode():
            model(*args, **kwargs)
        return
    except Exception as exc:
        error = one_line(exc)
    if defect := _default_config_defect(config_cls, error):
        raise NotInLibraryError(f"its default config cannot run its model ({defect}); on the harness's inputs: {error}")
    if not causal and not _CONFIG_LACKS.match(error):
        return
    args, kwargs = make(torch.Generator().manual_seed(0), "meta")
    try:
        with torch.device("meta"):
            default = model_cls(config_cls()).eval()
        with torch.inference_mode():
            default(*args, **kwargs)
    except Exception as exc:
        if one_line(exc) == error:
            raise NotInLibraryError(f"its default config fails the same way on the harness's inputs: {error}") from exc


def _default_config_defect(config_cls: type, error: str) -> str | None:
    """What in the library's default config keeps its own model from running whatever the inputs, checked on the
    installed library's default (a release that mends it runs the model again): a setting the forward reads that
    every part of the config leaves unset; a sub-config given a misspelt setting, so the setting meant is never
    applied; a detector with no feature levels for its encoder; and, by model type, parts the default config makes
    disagree (``_DEFAULT_DISAGREES``)."""
    try:
        default = config_cls()
    except Exception:
        return None
    if (unset := _CONFIG_UNSET.search(error)) and all(_setting(c, unset[1]) is None for _, c in _configs(default)):
        return f"it leaves `{unset[1]}` unset, which its forward reads"
    checks = (_misspelt_setting, _no_feature_levels, *_DEFAULT_DISAGREES.get(getattr(default, "model_type", ""), ()))
    return next((reason for check in checks if (reason := check(default))), None)


def _configs(config: Any, path: str = "config") -> list[tuple[str, Any]]:
    """(path, config) of the config and every sub-config under it."""
    found = [(path, config)]
    for name, value in vars(config).items():
        if hasattr(value, "to_dict") and hasattr(value, "model_type") and not name.startswith("_"):
            found += _configs(value, f"{path}.{name}")
    return found


def _misspelt_setting(config: Any) -> str | None:
    """A sub-config holding a setting its class does not declare, a near spelling of one it does (EdgeTAM's
    backbone ``archirecture``): the declared setting keeps its default (timm's resnet50 for the RepViT meant)."""
    for path, sub in _configs(config):
        try:
            declared = {f.name for f in dataclasses.fields(sub)}
        except TypeError:  # not a dataclass config: what it declares is not known
            continue
        for name in vars(sub):
            near = difflib.get_close_matches(name, declared, n=1, cutoff=0.85)
            if name not in declared and not name.startswith("_") and near:
                return f"{path} sets `{name}`, which {type(sub).__name__} lacks: `{near[0]}` keeps its default"
    return None


def _no_feature_levels(config: Any) -> str | None:
    """A detector whose default config builds no feature levels for its encoder (LW-DETR: no projector scales)."""
    if getattr(config, "num_feature_levels", None) == 0:
        return "`num_feature_levels` is 0: its encoder gets no feature map"
    return None


def _out_features(config: Any) -> int:
    return len(getattr(getattr(config, "backbone_config", None), "out_features", None) or ())


def _speech_vocabulary_too_small(config: Any) -> str | None:
    """CLVP's speech encoder embeds the ids its speech decoder predicts (the argmax of its logits)."""
    speech, decoder = config.speech_config.vocab_size, config.decoder_config.vocab_size
    if speech >= decoder:
        return None
    return (
        f"its speech encoder embeds the speech decoder's predicted ids, but its vocabulary ({speech}) is smaller "
        f"than the decoder's ({decoder})"
    )


def _neck_inputs_missing(config: Any) -> str | None:
    """PP-OCRv6's neck takes one feature map per entry of ``layer_list_out_channels`` from its backbone."""
    wanted, given = len(config.layer_list_out_channels), _out_features(config)
    if wanted == given:
        return None
    return f"its neck takes {wanted} feature maps (`layer_list_out_channels`), its backbone puts out {given}"


def _bridge_inputs_missing(config: Any) -> str | None:
    """UVDoc's head joins one bridge output per stage of its backbone."""
    wanted, given = len(config.backbone_config.stage_configs), _out_features(config)
    if wanted == given:
        return None
    return f"its head joins one bridge output per backbone stage ({wanted}), its backbone puts out {given}"


# Parts of a model type's default config that disagree, so that its own model cannot run: each check says why.
_DEFAULT_DISAGREES: dict[str, tuple[Callable[[Any], str | None], ...]] = {
    "clvp": (_speech_vocabulary_too_small,),
    "pp_ocrv6_small_det": (_neck_inputs_missing,),
    "uvdoc": (_bridge_inputs_missing,),
}
