"""The options ``wrap``, ``graphed_step`` and the compiler backend share: one name, one meaning, one check.

Every value is checked where it is given, and a wrong one raises ``ConfigError`` naming what is accepted.

- ``capture_after``: calls of one input signature before its graph is captured.
- ``max_graphs``: graphs kept, least recently used evicted.
- ``verify``: ``"on"`` proves every graph against eager before it is used (bit-identical, or a named class of
  non-determinism within its bound), ``"strict"`` demands bit identity, ``"off"`` skips the proof (unsafe).
- ``kernels``: ``"eager"`` replays eager's kernels; ``"compiled"`` replays them until Inductor's program, compiled
  beside the calls in another process, is proven as accurate as eager and faster, then replays that.
- ``tolerance_ulps``: the rounding bound for the named classes, in units of the dtype's epsilon at the
  output's magnitude (inference; training measures eager's own noise instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from .errors import ConfigError

VerifyMode = Literal["on", "strict", "off"]
VERIFY_MODES: Mapping[str, str] = {
    "on": "bit-identical, or a named eager-noise/capture-path class within the rounding bound",
    "strict": "bit identity only",
    "off": "no proof (unsafe)",
}

KernelsMode = Literal["eager", "compiled"]
KERNELS: Mapping[str, str] = {
    "eager": "the graphs replay eager's kernels",
    "compiled": "Inductor's program, compiled beside the calls, replaces them once proven as accurate and faster",
}


def check_int(name: str, value: Any, *, minimum: int, why: str = "") -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name}={value!r} is not accepted; pass an integer >= {minimum}{why}")
    return value


def check_number(name: str, value: Any, *, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum:
        raise ConfigError(f"{name}={value!r} is not accepted; pass a number >= {minimum:g}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not accepted; pass True or False")
    return value


def check_choice(name: str, value: Any, choices: Mapping[str, str]) -> str:
    """``value`` must be one of ``choices`` (name -> what it means); the error lists them with their meaning."""
    if not isinstance(value, str) or value not in choices:
        listed = "; ".join(f"{k!r} ({meaning})" for k, meaning in choices.items())
        raise ConfigError(f"{name}={value!r} is not accepted; use {listed}")
    return value


def check_verify(value: Any) -> VerifyMode:
    if isinstance(value, bool):
        raise ConfigError(f"verify={value!r} is not accepted; use 'on', 'strict' or 'off' (a string, not a bool)")
    return check_choice("verify", value, VERIFY_MODES)  # type: ignore[return-value]


def check_instance(name: str, value: Any, kind: type | tuple[type, ...], fix: str) -> Any:
    """``value`` must be a ``kind``; the error says what was passed and how to pass the right thing."""
    if not isinstance(value, kind):
        raise ConfigError(f"{name}= takes {_names(kind)}, got {type(value).__name__}; {fix}")
    return value


def check_known(where: str, given: Mapping[str, Any], known: Mapping[str, Any]) -> None:
    """No option ``where`` does not know: a misspelt one would otherwise be ignored silently."""
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ConfigError(
            f"{where} does not know the option(s) {', '.join(map(repr, unknown))}; it accepts "
            f"{', '.join(map(repr, known))}"
        )


def _names(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = (f"{k.__module__}.{k.__qualname__}".replace("torch.nn.modules.module.", "torch.nn.") for k in kinds)
    return " or ".join(f"a {name}" for name in names)
