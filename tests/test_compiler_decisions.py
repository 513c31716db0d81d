"""CPU tests of the compiler path's persisted variant decisions: keys, the on-disk cache, choose(), drift."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import fx, nn

from launchless.compiler.decisions import (
    VARIANTS,
    Decision,
    DecisionCache,
    DecisionKey,
    DriftMonitor,
    choose,
    default_cache_dir,
    environment_key_fields,
    graph_hash,
)

LOGGER = "launchless"
KEY_FIELDS = [f.name for f in dataclasses.fields(DecisionKey)]


def make_key(**changes: str) -> DecisionKey:
    base = DecisionKey(
        graph_hash="g" * 64,
        input_signature="(f32[8,16]@cuda:0,)",
        gpu_name="NVIDIA H200",
        driver="570.86.15",
        torch_version="2.9.0",
        triton_version="3.5.0",
        cuda_version="12.8",
    )
    return dataclasses.replace(base, **changes)


def make_decision(variant: str = "graph") -> Decision:
    times_ms = {"no-graph": 2.0, "graph": 1.0, "graph+pi": 1.1}
    return Decision(variant=variant, times_ms=times_ms, decided_at="2025-01-02T03:04:05+00:00")


def warnings_logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


# ---- keys ------------------------------------------------------------------------------------------------


def test_digest_is_stable_hex_and_covers_every_field() -> None:
    key = make_key()
    assert key.digest() == make_key().digest()
    assert re.fullmatch(r"[0-9a-f]{64}", key.digest())
    digests = {dataclasses.replace(key, **{name: "other"}).digest() for name in KEY_FIELDS}
    assert len(digests) == len(KEY_FIELDS) and key.digest() not in digests


def test_environment_fields_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` fail
    fields = environment_key_fields()
    assert set(fields) == set(KEY_FIELDS) - {"graph_hash", "input_signature", "method"}
    assert fields["gpu_name"] == "none" and fields["driver"] == "none" and fields["triton_version"] == "none"
    assert fields["torch_version"] == str(torch.__version__)
    assert fields["cuda_version"] == str(torch.version.cuda or "none")
    key = DecisionKey.current("h", "sig")
    assert (key.graph_hash, key.input_signature, key.gpu_name) == ("h", "sig", "none")


def test_environment_fields_with_cuda_but_no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_nvml() -> None:
        raise ModuleNotFoundError("pynvml")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "_get_pynvml_handler", no_nvml)
    fields = environment_key_fields()
    assert fields["gpu_name"] == "Fake GPU" and fields["driver"] == "unknown"


class Mlp(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.register_buffer("scale", torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) * self.scale


class MlpGelu(Mlp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(self.fc(x)) * self.scale


def test_graph_hash_equal_for_separately_traced_identical_modules() -> None:
    torch.manual_seed(0)
    a = fx.symbolic_trace(Mlp())
    torch.manual_seed(1)
    b = fx.symbolic_trace(Mlp())
    assert not torch.equal(a.fc.weight, b.fc.weight)  # different values: must not matter
    assert graph_hash(a) == graph_hash(b)
    assert re.fullmatch(r"[0-9a-f]{64}", graph_hash(a))


def test_graph_hash_differs_for_different_code_or_shapes() -> None:
    base = graph_hash(fx.symbolic_trace(Mlp()))
    assert graph_hash(fx.symbolic_trace(MlpGelu())) != base
    assert graph_hash(fx.symbolic_trace(Mlp(width=16))) != base  # same code, other parameter shapes


def test_graph_hash_includes_placeholder_shapes_and_dtypes() -> None:
    def traced(value: torch.Tensor) -> fx.GraphModule:
        gm = fx.symbolic_trace(Mlp())
        next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"] = value
        return gm

    f32 = graph_hash(traced(torch.empty(4, 8)))
    assert f32 == graph_hash(traced(torch.zeros(4, 8)))
    assert f32 != graph_hash(traced(torch.empty(2, 8)))
    assert f32 != graph_hash(traced(torch.empty(4, 8, dtype=torch.float16)))


def test_graph_hash_is_stable_across_processes() -> None:
    source = textwrap.dedent(
        """
        import torch
        from torch import fx, nn
        from launchless.compiler.decisions import graph_hash

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)

            def forward(self, x):
                return torch.tanh(self.fc(x)) + 1

        print(graph_hash(fx.symbolic_trace(M())))
        """
    )
    namespace: dict = {}
    exec(compile(source.replace("print(", "RESULT = ("), "<m>", "exec"), namespace)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == namespace["RESULT"]


# ---- Decision and choose() -------------------------------------------------------------------------------


def test_decision_json_round_trip_and_default_date() -> None:
    d = make_decision("graph+pi")
    assert Decision.from_json(d.to_json()) == d
    fresh = Decision(variant="no-graph", times_ms={"no-graph": 1})
    assert isinstance(fresh.times_ms["no-graph"], float)
    assert datetime.datetime.fromisoformat(fresh.decided_at).tzinfo is not None


@pytest.mark.parametrize(
    "data",
    [
        {"variant": "eager", "times_ms": {}, "decided_at": "x"},
        {"variant": "graph", "times_ms": {"cudagraph": 1.0}, "decided_at": "x"},
        {"variant": "graph", "times_ms": [1.0], "decided_at": "x"},
        {"variant": "graph", "times_ms": {"graph": "fast"}, "decided_at": "x"},
        {"variant": "graph", "times_ms": {"graph": 1.0}},
    ],
)
def test_decision_rejects_malformed_data(data: dict) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        Decision.from_json(json.dumps(data))


def test_choose_picks_fastest_when_clearly_faster() -> None:
    assert choose({"no-graph": 10.0, "graph": 5.0, "graph+pi": 4.0}) == "graph+pi"
    assert choose({"no-graph": 10.0, "graph": 5.0, "graph+pi": 6.0}) == "graph"
    assert choose({"no-graph": 1.0, "graph": 5.0, "graph+pi": 6.0}) == "no-graph"
    assert choose({"graph": 2.0, "graph+pi": 1.0}) == "graph+pi"  # a subset is fine


def test_choose_prefers_simpler_within_margin() -> None:
    assert VARIANTS == ("no-graph", "graph", "graph+pi")  # simplest first
    assert choose({"no-graph": 100.0, "graph": 98.0, "graph+pi": 97.5}) == "no-graph"
    assert choose({"no-graph": 100.0, "graph": 97.0}) == "no-graph"  # exactly the margin is not "more than"
    assert choose({"no-graph": 100.0, "graph": 96.9}) == "graph"
    assert choose({"no-graph": 100.0, "graph": 90.0, "graph+pi": 88.0}) == "graph"  # pi within 3% of graph
    assert choose({"no-graph": 100.0, "graph": 98.0}, margin=0.0) == "graph"
    assert choose({"no-graph": 100.0, "graph": 90.0}, margin=0.2) == "no-graph"
    assert choose({"no-graph": 1.0, "graph": 1.0, "graph+pi": 1.0}) == "no-graph"  # ties go to the simplest


@pytest.mark.parametrize(
    ("times", "margin", "message"),
    [
        ({}, 0.03, "empty"),
        ({"no-graph": 1.0, "cudagraph": 0.5}, 0.03, "cudagraph"),
        ({"no-graph": 1.0}, -0.1, "margin"),
        ({"no-graph": float("nan"), "graph": 1.0}, 0.03, "finite"),
    ],
)
def test_choose_errors(times: dict, margin: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        choose(times, margin=margin)


# ---- DecisionCache ---------------------------------------------------------------------------------------


def test_put_get_round_trip_across_instances(tmp_path) -> None:
    cache = DecisionCache(tmp_path / "d")
    key, decision = make_key(), make_decision()
    assert cache.get(key) is None and len(cache) == 0
    cache.put(key, decision)
    assert cache.get(key) == decision
    stored = json.loads((tmp_path / "d" / f"{key.digest()}.json").read_text())
    assert stored["key"] == dataclasses.asdict(key)
    assert DecisionCache(tmp_path / "d").get(key) == decision  # a later process reuses it
    assert len(cache) == 1
    assert [p.name for p in (tmp_path / "d").iterdir()] == [f"{key.digest()}.json"]  # no temp files left


def test_put_replaces_previous_decision(tmp_path) -> None:
    cache = DecisionCache(tmp_path)
    cache.put(make_key(), make_decision("graph"))
    cache.put(make_key(), make_decision("no-graph"))
    assert cache.get(make_key()).variant == "no-graph" and len(cache) == 1


@pytest.mark.parametrize("name", [n for n in KEY_FIELDS])
def test_any_key_field_change_is_a_miss(tmp_path, name: str) -> None:
    cache = DecisionCache(tmp_path)
    cache.put(make_key(), make_decision())
    assert cache.get(make_key()) is not None
    assert cache.get(make_key(**{name: "changed"})) is None


def test_default_directory_from_env_or_home(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path / "env"))
    assert DecisionCache().directory == tmp_path / "env"
    DecisionCache().put(make_key(), make_decision())
    assert (tmp_path / "env" / f"{make_key().digest()}.json").is_file()
    monkeypatch.delenv("LAUNCHLESS_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "launchless" / "decisions"
    assert DecisionCache(tmp_path / "explicit").directory == tmp_path / "explicit"


def test_reprofile_misses_but_writes(tmp_path) -> None:
    DecisionCache(tmp_path).put(make_key(), make_decision("graph"))
    reprofiling = DecisionCache(tmp_path, reprofile=True)
    assert reprofiling.get(make_key()) is None
    reprofiling.put(make_key(), make_decision("graph+pi"))
    assert reprofiling.get(make_key()) is None
    assert DecisionCache(tmp_path).get(make_key()).variant == "graph+pi"


def test_clear_returns_count_and_empties(tmp_path) -> None:
    cache = DecisionCache(tmp_path)
    keys = [make_key(graph_hash=f"g{i}") for i in range(3)]
    for key in keys:
        cache.put(key, make_decision())
    (tmp_path / "notes.txt").write_text("not a decision")
    assert len(cache) == 3
    assert cache.clear() == 3
    assert len(cache) == 0 and all(cache.get(k) is None for k in keys)
    assert (tmp_path / "notes.txt").exists()
    assert cache.clear() == 0
    assert DecisionCache(tmp_path / "missing").clear() == 0


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "",
        json.dumps({"decision": make_decision().to_dict()}),  # no key
        json.dumps({"key": dataclasses.asdict(make_key()), "decision": {"variant": "eager"}}),
        json.dumps([1, 2, 3]),
    ],
)
def test_corrupt_file_is_a_miss_and_removed(tmp_path, content: str) -> None:
    cache = DecisionCache(tmp_path)
    path = tmp_path / f"{make_key().digest()}.json"
    path.write_text(content)
    assert cache.get(make_key()) is None
    assert not path.exists()
    cache.put(make_key(), make_decision())  # and the slot is usable again
    assert cache.get(make_key()) == make_decision()


def test_stored_key_mismatch_is_a_miss(tmp_path) -> None:
    cache = DecisionCache(tmp_path)
    requested, other = make_key(), make_key(gpu_name="NVIDIA A100")
    payload = {"key": dataclasses.asdict(other), "decision": make_decision().to_dict()}
    (tmp_path / f"{requested.digest()}.json").write_text(json.dumps(payload))  # a simulated collision
    assert cache.get(requested) is None
    cache.put(requested, make_decision("no-graph"))
    assert cache.get(requested).variant == "no-graph"


def _assert_memory_fallback(cache: DecisionCache, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    a, b = make_key(graph_hash="a"), make_key(graph_hash="b")
    cache.put(a, make_decision("graph"))
    cache.put(b, make_decision("no-graph"))
    cache.put(a, make_decision("graph+pi"))
    records = warnings_logged(caplog)
    assert len(records) == 1 and "memory" in records[0].getMessage()
    assert cache.get(a).variant == "graph+pi" and cache.get(b).variant == "no-graph"
    assert cache.get(make_key(graph_hash="c")) is None
    assert len(cache) == 2
    assert cache.clear() == 2 and cache.get(a) is None and len(cache) == 0


def _can_write(directory) -> bool:
    try:
        (directory / "probe").write_text("x")
    except OSError:
        return False
    (directory / "probe").unlink()
    return True


def test_unwritable_directory_warns_once_and_keeps_decisions_in_memory(tmp_path, caplog) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o500)
    try:
        if _can_write(directory):
            pytest.skip("directory permissions are not enforced here (running as root)")
        _assert_memory_fallback(DecisionCache(directory), caplog)
        assert list(directory.iterdir()) == []
    finally:
        directory.chmod(0o700)


def test_directory_that_is_a_file_falls_back_to_memory(tmp_path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    _assert_memory_fallback(DecisionCache(blocker / "decisions"), caplog)
    assert blocker.read_text() == "in the way"


# ---- DriftMonitor ----------------------------------------------------------------------------------------


def test_should_sample_once_every_n_calls() -> None:
    monitor = DriftMonitor(make_decision(), every=3)
    assert [monitor.should_sample() for _ in range(9)] == [False, False, True] * 3
    assert all(DriftMonitor(make_decision(), every=1).should_sample() for _ in range(5))
    default = DriftMonitor(make_decision())
    assert sum(default.should_sample() for _ in range(5000)) == 5


def test_drift_needs_a_full_window_over_the_margin() -> None:
    monitor = DriftMonitor(make_decision("graph"), margin=0.10, window=5)  # graph was measured at 1.0 ms
    assert monitor.baseline_ms == 1.0
    for _ in range(4):
        monitor.record(5.0)
    assert not monitor.drifted()  # four slow samples: window not full yet
    monitor.record(5.0)
    assert monitor.drifted()


def test_no_drift_within_margin_or_from_one_outlier() -> None:
    monitor = DriftMonitor(make_decision("graph"), margin=0.10, window=5)
    for ms in (1.05, 1.1, 1.08, 50.0, 1.02):
        monitor.record(ms)
    assert monitor.median_ms() == 1.08 and not monitor.drifted()


def test_window_keeps_only_recent_samples() -> None:
    monitor = DriftMonitor(make_decision("graph"), margin=0.10, window=3)
    for ms in (9.0, 9.0, 9.0):
        monitor.record(ms)
    assert monitor.drifted()
    for ms in (1.0, 1.0):
        monitor.record(ms)
    assert not monitor.drifted()  # the slow samples rolled out


def test_reset_starts_over_against_the_new_decision() -> None:
    monitor = DriftMonitor(make_decision("graph"), window=2, every=2)
    monitor.should_sample()
    monitor.record(3.0)
    monitor.record(3.0)
    assert monitor.drifted()
    monitor.reset(make_decision("no-graph"))  # re-decided: no-graph at 2.0 ms
    assert monitor.baseline_ms == 2.0 and monitor.median_ms() is None and not monitor.drifted()
    assert [monitor.should_sample() for _ in range(2)] == [False, True]  # the counter restarted too
    monitor.record(3.0)
    monitor.record(3.0)
    assert monitor.drifted()


@pytest.mark.parametrize("kwargs", [{"every": 0}, {"window": 0}, {"margin": -0.5}])
def test_drift_monitor_rejects_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        DriftMonitor(make_decision(), **kwargs)


def test_drift_monitor_needs_the_decided_variants_time() -> None:
    with pytest.raises(ValueError, match="graph"):
        DriftMonitor(Decision(variant="graph", times_ms={"no-graph": 1.0}))


def test_pi_is_timed_on_inputs_that_move_every_call_with_the_same_values_and_layout() -> None:
    from launchless.compiler.select import alternating

    x = torch.arange(24.0).reshape(4, 6)[:, 1:5].t()  # a strided view with an offset: not contiguous
    w = torch.ones(3)
    inputs = alternating([x, w, 7], slots=[0])
    first, second, third = inputs(), inputs(), inputs()
    assert first[0] is x and third[0] is x  # the call's own inputs, then the copy, in turn
    moved = second[0]
    assert moved.data_ptr() != x.data_ptr() and torch.equal(moved, x)
    assert moved.stride() == x.stride() and moved.shape == x.shape  # the kernels index it as they index x
    assert second[1] is w and second[2] == 7  # static and non-tensor inputs stay as they are


def test_a_decision_measured_the_old_way_is_not_reused(tmp_path) -> None:
    cache = DecisionCache(tmp_path)
    new = make_key()
    old = dataclasses.replace(new, method="1")
    cache.put(old, make_decision("graph+pi"))
    assert cache.get(new) is None and cache.get(old).variant == "graph+pi"


def test_variants_are_timed_on_calls_not_synchronized_between_them(monkeypatch) -> None:
    import contextlib

    from launchless.compiler import select

    log: list[str] = []

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            self.at = 0.0

        def record(self) -> None:
            self.at = float(len(log))  # "time" = what happened so far

        def elapsed_time(self, other: Event) -> float:
            return other.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *_: log.append("sync"))
    monkeypatch.setattr(torch.cuda, "device", lambda _: contextlib.nullcontext())
    ms = select.time_ms(lambda: log.append("call"), torch.device("cuda"), warmup=2, runs=5)
    assert log == ["call"] * 2 + ["sync"] + ["call"] * 5 + ["sync"]  # no sync between the timed calls
    assert ms == 1.0  # per call
