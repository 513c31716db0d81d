"""The transformers populations: every causal LM the auto mapping lists, and base models of every modality.

Each architecture is built from its own config class with ``shrink_config``'s sizes and fed what ``hf_inputs``
reads off its forward's signature and its config. When the shrunk model does not build, the default config is
tried on ``meta``: if that fails too, the library itself cannot build the architecture here (``library_failures``:
which failures are the library's own).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from functools import partial
from typing import Any

import torch

from ...errors import one_line
from .candidate import Built, Candidate, Library, NotInLibraryError
from .hf_inputs import (
    KNOWN_INPUTS,
    MAIN_INPUTS,
    ONLY_WHERE_OPTIONAL,
    config_attribute,
    fit_layout,
    make_inputs,
    select_defaults,
    wanted_inputs,
)
from .library_failures import default_builds, default_runs
from .shrink import shrink_config

# Derived sizes the shrinker's value is kept for: a vocabulary or token id derived again would be full size.
_KEEPS_SHRUNK = re.compile(r".*(vocab.*|_id|_ids|_index)$")


def _classes(model_type: str, model_class: str) -> tuple[type, type]:
    """(config class, model class) of an auto-mapping entry; an import failure means the library cannot build it."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    try:
        model_cls = getattr(transformers, model_class)
        config_cls = getattr(model_cls, "config_class", None) or getattr(transformers, CONFIG_MAPPING_NAMES[model_type])
        return config_cls, model_cls
    except Exception as exc:  # missing optional package, class not exported
        raise NotInLibraryError(f"not importable: {one_line(exc)}") from exc


def _config(config_cls: type, model_cls: type, **shrinking: Any) -> Any:
    """The default config of the class with every size shrunk (``shrinking``: ``shrink_config``'s options); sizes
    it derives from others left for it to derive again from the shrunk ones."""
    default = config_cls()
    shrunk = shrink_config(default.to_dict(), **shrinking)
    dropped = _drop_derived(default, shrunk)
    for key in ("transformers_version", "model_type", "architectures", "_name_or_path"):
        shrunk.pop(key, None)
    config = config_cls(**shrunk)  # the library picks the attention (SDPA where the model and its parts have it)
    # a size that comes back at its full default, or not at all, was not derived from the shrunk sizes; one that
    # comes back zero was divided by a count the shrinker left: each keeps the shrinker's value
    built = config.to_dict()
    restored = [(path, value) for path, value, before in dropped if _at(built, path) in (before, None, 0)]
    for path, value in restored:
        _at(shrunk, path[:-1])[path[-1]] = value
    return config_cls(**shrunk) if restored else config


def _drop_derived(config: Any, shrunk: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[tuple, int, int]]:
    """Leave out of ``shrunk`` the integer sizes ``config`` derived from its other attributes on construction;
    returns each one left out as (path, shrunk value, default value).

    A default config holds, besides what its class declares, sizes its ``__post_init__`` computed: attributes the
    class leaves ``None`` (a per-stack layer count that turns the layer count into the number of attention calls,
    an attention width twice the model width) or does not declare at all. Shrunk one by one by their names, they
    no longer match the sizes they were computed from; left out, the config computes them again from the shrunk
    sizes. Vocabularies and token ids keep the shrinker's values (a default derived again would be full size)."""
    try:
        declared = {f.name: f for f in dataclasses.fields(config)}
    except TypeError:  # not a dataclass config: nothing is known to be derived
        return []
    aliases = getattr(config, "attribute_map", None) or {}
    for alias, name in aliases.items():  # a declared attribute that its config writes out under another name
        if alias in declared:
            declared.setdefault(name, declared[alias])
        elif name in declared:
            declared.setdefault(alias, declared[name])
    original, dropped = config.to_dict(), []
    for key, value in list(shrunk.items()):
        before = original.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            sub = config_attribute(config, key)
            if hasattr(sub, "to_dict"):
                dropped += _drop_derived(sub, value, (*path, key))
        elif isinstance(before, int) and not isinstance(before, bool) and not _KEEPS_SHRUNK.match(str(key)):
            field = declared.get(key)
            if field is None and (key in {*aliases, *aliases.values()} or key not in vars(config)):
                continue  # another name of a property, or a value only its ``to_dict`` writes: not derived
            if field is None or field.default is None:
                dropped.append(((*path, key), shrunk.pop(key), before))
    return dropped


def _at(tree: Any, path: tuple) -> Any:
    """The value at ``path`` of nested dicts (None where there is none)."""
    for key in path:
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def _build(config_cls: type, model_cls: type, device: str) -> tuple[Any, torch.nn.Module]:
    """(config, model) shrunk to one layer of every kind; else two (a model whose layers of a kind share one block
    of weights ties the later layers' to the first, and with one layer of the kind there is none to tie); else with
    multimodal rope sections of the shrunk head (a model whose code falls back to sections of the full head)."""
    first: Exception | None = None
    for variant in ({}, {"per_kind": 2}, {"rope_sections": True}):
        try:
            config = _config(config_cls, model_cls, **variant)
            with torch.device(device):
                return config, model_cls(config)
        except ImportError:
            raise
        except Exception as exc:
            first = first or exc
    assert first is not None
    raise first


def build_architecture(model_type: str, model_class: str, device: str = "cpu", *, causal: bool = False) -> Built:
    """The shrunk ``model_class`` on ``device`` in eval mode, with the inputs its forward takes (``causal``: a
    causal LM, whose ids and mask the library itself must run)."""
    config_cls, model_cls = _classes(model_type, model_class)
    try:
        config, model = _build(config_cls, model_cls, device)
    except ImportError as exc:  # the architecture needs a package that is not installed
        raise NotInLibraryError(f"needs a package that is not installed: {one_line(exc)}") from exc
    except Exception:
        default_builds(config_cls, model_cls)
        raise
    model.eval()
    _fit_rope_sections(model)
    select_defaults(model, config)
    wanted = wanted_inputs(model)
    layout = fit_layout(model, config, wanted)
    make = partial(make_inputs, wanted, config, layout=layout)
    default_runs(model, config_cls, model_cls, make, causal=causal)
    return Built(model, make, model_class)


def _fit_rope_sections(model: torch.nn.Module) -> None:
    """Multimodal rope sections a model takes from its code's default (not its config) fitted to the shrunk head.

    Qwen-VL-like rotary embeddings read ``rope_parameters.get("mrope_section", <default for the full head>)``: a
    config without the key leaves sections summing to the original head's half, which no longer splits the shrunk
    frequencies. Each section is rescaled to the built ``inv_freq``, keeping its share (time, height, width)."""
    for module in model.modules():
        section, inv_freq = getattr(module, "mrope_section", None), getattr(module, "inv_freq", None)
        if not isinstance(section, list) or not isinstance(inv_freq, torch.Tensor) or not section:
            continue
        total = inv_freq.shape[-1]
        if sum(section) == total or total < len(section):
            continue
        scaled = [max(1, s * total // sum(section)) for s in section]
        scaled[0] += total - sum(scaled)
        module.mrope_section = scaled


def causal_candidates() -> list[Candidate]:
    """Every architecture of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return [
        Candidate(Library.TRANSFORMERS_CAUSAL, name, "decoder", partial(build_architecture, name, cls, causal=True))
        for name, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()
    ]


def feedable(model_class: str) -> bool:
    """The forward takes a main input the harness makes and requires nothing else (an unimportable class is
    kept: it is listed as not building in the library)."""
    import transformers

    try:
        parameters = inspect.signature(getattr(transformers, model_class).forward).parameters
    except Exception:
        return True
    required = {
        n for n, p in parameters.items() if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    return bool(MAIN_INPUTS & set(parameters)) and required - {"self"} <= set(KNOWN_INPUTS) - ONLY_WHERE_OPTIONAL


def base_candidates() -> list[Candidate]:
    """The base models of ``MODEL_MAPPING_NAMES`` not already causal-LM candidates, whose forward the harness can
    feed (text, images, audio; not time series, keypoint matchers or models needing grids and sessions)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    found = []
    for name, classes in MODEL_MAPPING_NAMES.items():
        cls = classes[0] if isinstance(classes, (tuple, list)) else classes
        if name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or not feedable(cls):
            continue
        found.append(Candidate(Library.TRANSFORMERS, name, _modality(name), partial(build_architecture, name, cls)))
    return found


def _modality(model_class: str) -> str:
    return "base"
