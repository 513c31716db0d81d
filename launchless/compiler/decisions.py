"""Which variant each FX graph runs as, decided once by measurement and remembered on disk.

GraCE's selective CUDA graphs: a captured graph is not always faster (copies into placeholders can cost more
than the launches they save), so the backend times "no-graph", "graph" and "graph+pi" on real inputs and
keeps the fastest. Timing costs seconds per graph, so the decision is persisted and reused by later processes
-- but only under the exact same graph, inputs, GPU, driver and library versions, since any of them can flip
the winner. In production a ``DriftMonitor`` samples the chosen variant and says when to re-decide.
Timing itself lives elsewhere; everything here is pure Python.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import logging
import math
import os
import statistics
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx

log = logging.getLogger("launchless")

VARIANTS: tuple[str, ...] = ("no-graph", "graph", "graph+pi")  # simplest first: ties go to the simpler one
CACHE_DIR_ENV = "LAUNCHLESS_CACHE_DIR"
_SUFFIX = ".json"


# --- keys -------------------------------------------------------------------------------------------------


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _describe_value(value: Any) -> str:
    """Shape and dtype of a tensor (never its values: weights change, the decision does not)."""
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}:{value.dtype}"
    if isinstance(value, (bool, int, float, str)) or value is None:
        return f"{type(value).__name__}={value!r}"
    return type(value).__name__


def _placeholder_lines(gm: fx.GraphModule) -> list[str]:
    lines = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            value = node.meta.get("val", node.meta.get("example_value"))
            lines.append(f"in {node.name}: {_describe_value(value)}")
    return lines


def _constant_lines(gm: fx.GraphModule) -> list[str]:
    tensors = dict(gm.named_parameters(remove_duplicate=False))
    tensors.update(gm.named_buffers(remove_duplicate=False))
    for node in gm.graph.nodes:
        if node.op == "get_attr" and str(node.target) not in tensors:
            with contextlib.suppress(AttributeError):
                tensors[str(node.target)] = _fetch_attr(gm, str(node.target))
    return [f"const {name}: {_describe_value(value)}" for name, value in sorted(tensors.items())]


def _fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def graph_hash(gm: fx.GraphModule) -> str:
    """Stable across processes: the generated code plus input and constant shapes/dtypes, no tensor values."""
    parts = [gm.code, *_placeholder_lines(gm), *_constant_lines(gm)]
    return _sha256("\n".join(parts))


def _driver_version() -> str:
    """The NVIDIA driver through torch.cuda's NVML handle; "unknown" where NVML is not there."""
    try:
        handle_for = torch.cuda._get_pynvml_handler  # initialises NVML the way torch.cuda does
        handle_for()
        import pynvml

        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return "unknown"


def _triton_version() -> str:
    try:
        import triton
    except Exception:
        return "none"
    return str(getattr(triton, "__version__", "unknown"))


def environment_key_fields() -> dict[str, str]:
    """The environment half of a key: any of these changing can change which variant is fastest."""
    cuda = torch.cuda.is_available()
    return {
        "gpu_name": torch.cuda.get_device_name() if cuda else "none",
        "driver": _driver_version() if cuda else "none",
        "torch_version": str(torch.__version__),
        "triton_version": _triton_version(),
        "cuda_version": str(torch.version.cuda or "none"),
    }


# how variants are timed -- 2: calls not synchronized between them, graph+PI on inputs that move every call;
# 1: single synchronized calls on the capturing call's inputs
MEASUREMENT = "2"


@dataclass(frozen=True)
class DecisionKey:
    """Everything a measured decision depends on; a decision is reused only under an equal key."""

    graph_hash: str
    input_signature: str
    gpu_name: str
    driver: str
    torch_version: str
    triton_version: str
    cuda_version: str
    method: str = MEASUREMENT  # how variants are timed: a change re-decides what was measured the old way

    @classmethod
    def current(cls, graph_hash: str, input_signature: str) -> DecisionKey:
        """A key for this graph and inputs in the running environment."""
        return cls(graph_hash=graph_hash, input_signature=input_signature, **environment_key_fields())

    def fields(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        """Hex SHA-256 of all fields: the same key gives the same file name in every process."""
        return _sha256(json.dumps(self.fields(), sort_keys=True))


# --- decisions --------------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _check_variants(names: Any) -> None:
    unknown = sorted(str(n) for n in names if n not in VARIANTS)
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; expected names from {list(VARIANTS)}")


@dataclass
class Decision:
    """The chosen variant with the median times that chose it (kept to judge drift against)."""

    variant: str
    times_ms: dict[str, float]
    decided_at: str = field(default_factory=_now)

    def __post_init__(self) -> None:
        _check_variants([self.variant, *self.times_ms])
        if not isinstance(self.decided_at, str):
            raise ValueError(f"decided_at must be an ISO date string, not {type(self.decided_at).__name__}")
        self.times_ms = {str(k): float(v) for k, v in self.times_ms.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "times_ms": dict(self.times_ms), "decided_at": self.decided_at}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        """Raises ValueError/KeyError/TypeError on anything malformed (the cache turns that into a miss)."""
        if not isinstance(data.get("times_ms"), dict):
            raise ValueError("times_ms must be an object")
        return cls(variant=data["variant"], times_ms=data["times_ms"], decided_at=data["decided_at"])

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Decision:
        return cls.from_dict(json.loads(text))


def choose(times_ms: dict[str, float], margin: float = 0.03) -> str:
    """The fastest variant, but a more complex one must beat the simpler choice by more than ``margin``.

    Timing noise of a few percent should not buy the extra memory and copies of a captured graph.
    """
    if not times_ms:
        raise ValueError("choose() needs at least one measured variant; times_ms is empty")
    _check_variants(times_ms)
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    bad = {k: v for k, v in times_ms.items() if not (math.isfinite(v) and v >= 0)}
    if bad:
        raise ValueError(f"times must be finite and non-negative, got {bad}")
    measured = [v for v in VARIANTS if v in times_ms]
    best = measured[0]
    for candidate in measured[1:]:
        if _gain(times_ms[best], times_ms[candidate]) > margin:
            best = candidate
    return best


def _gain(simple_ms: float, complex_ms: float) -> float:
    """Relative saving of the complex variant over the simple one (0 when the simple one takes no time)."""
    return (simple_ms - complex_ms) / simple_ms if simple_ms > 0 else 0.0


# --- the on-disk store ------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$LAUNCHLESS_CACHE_DIR`` if set, else ``~/.cache/launchless/decisions``."""
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "launchless" / "decisions"


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except OSError:
        return False
    return True


class DecisionCache:
    """Decisions keyed by ``DecisionKey``, one JSON file each, shared by every process on the machine.

    A bad file never crashes compilation: it is a miss. If the directory cannot be written, the cache warns
    once and keeps decisions in memory for this process. ``reprofile=True`` ignores stored decisions (always
    a miss) but still writes new ones, so a re-measurement replaces what was there.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, reprofile: bool = False) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.reprofile = reprofile
        self._memory: dict[str, tuple[DecisionKey, Decision]] = {}
        self._writable = True  # until a write fails; then memory only, with one warning

    def _path(self, key: DecisionKey) -> Path:
        return self.directory / f"{key.digest()}{_SUFFIX}"

    def get(self, key: DecisionKey) -> Decision | None:
        if self.reprofile:
            return None
        held = self._memory.get(key.digest())
        if held is not None and held[0] == key:
            return held[1]
        return self._read(self._path(key), key)

    def _read(self, path: Path, key: DecisionKey) -> Decision | None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.debug("unreadable decision %s (%s): treated as a miss", path, exc)
            _unlink(path)
            return None
        return self._parse(path, text, key)

    def _parse(self, path: Path, text: str, key: DecisionKey) -> Decision | None:
        try:
            data = json.loads(text)
            stored_key = data["key"]
            decision = Decision.from_dict(data["decision"])
        except (ValueError, KeyError, TypeError) as exc:
            log.debug("corrupt decision %s (%s): removed", path, exc)
            _unlink(path)
            return None
        if stored_key != key.fields():
            log.debug("decision %s was stored for another key: treated as a miss", path)
            return None
        return decision

    def put(self, key: DecisionKey, decision: Decision) -> None:
        payload = json.dumps({"key": key.fields(), "decision": decision.to_dict()}, sort_keys=True, indent=1)
        if self._writable:
            try:
                self._write(self._path(key), payload)
                return
            except OSError as exc:
                self._fall_back(exc)
        self._memory[key.digest()] = (key, decision)

    def _write(self, path: Path, payload: str) -> None:
        """Temp file then ``os.replace``: a concurrent reader sees the old file or the new one, never half."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(payload)
            os.replace(tmp, path)
        except BaseException:
            _unlink(Path(tmp))
            raise

    def _fall_back(self, exc: OSError) -> None:
        """Called on the first failed write only (later puts skip the disk), so it warns once."""
        self._writable = False
        log.warning(
            "launchless: cannot write the decision cache at %s (%s); decisions are kept in memory for this "
            "process only (set %s to a writable directory)",
            self.directory,
            exc,
            CACHE_DIR_ENV,
        )

    def _files(self) -> list[Path]:
        try:
            return [p for p in self.directory.iterdir() if p.suffix == _SUFFIX and p.is_file()]
        except OSError:
            return []

    def clear(self) -> int:
        """Remove every stored decision (disk and memory); returns how many were removed."""
        removed = {p.stem for p in self._files() if _unlink(p)}
        removed.update(self._memory)
        self._memory.clear()
        return len(removed)

    def __len__(self) -> int:
        return len({p.stem for p in self._files()} | set(self._memory))


# --- production drift -------------------------------------------------------------------------------------


class DriftMonitor:
    """Samples the chosen variant in production and says when it has become slower than when it was chosen.

    Clocks, thermal state, co-tenants and input data move; a decision measured at compile time can stop being
    right. Sampling one call in ``every`` keeps the cost negligible; the median of ``window`` samples keeps one
    slow call from triggering a re-decision.
    """

    def __init__(self, decision: Decision, margin: float = 0.10, every: int = 1000, window: int = 20) -> None:
        if every < 1 or window < 1:
            raise ValueError(f"every and window must be >= 1, got every={every}, window={window}")
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        self.margin = margin
        self.every = every
        self.window = window
        self._samples: deque[float] = deque(maxlen=window)
        self._calls = 0
        self.reset(decision)

    def reset(self, decision: Decision) -> None:
        """Start over against a new (re-made) decision: old samples judged the old variant."""
        if decision.variant not in decision.times_ms:
            raise ValueError(f"decision has no measured time for its variant {decision.variant!r}")
        self.decision = decision
        self._samples.clear()
        self._calls = 0

    @property
    def baseline_ms(self) -> float:
        return self.decision.times_ms[self.decision.variant]

    def should_sample(self) -> bool:
        """True on every ``every``-th call: one increment and one comparison on the hot path."""
        self._calls += 1
        if self._calls < self.every:
            return False
        self._calls = 0
        return True

    def record(self, ms: float) -> None:
        self._samples.append(float(ms))

    def median_ms(self) -> float | None:
        return statistics.median(self._samples) if self._samples else None

    def drifted(self) -> bool:
        """True once a full window's median is slower than the decided time by more than ``margin``."""
        if len(self._samples) < self.window:
            return False
        return statistics.median(self._samples) > self.baseline_ms * (1 + self.margin)
