"""Host cost of launchless's replay path, and of the training state check, per call.

Two measurements, both on a CUDA GPU:

1. ``wrap`` against a hand-written replay of the same graph (static copy in, replay, clone out), in rounds that
   alternate between the two from an idle GPU (``timing.host_overhead_us``): the wrapper's own Python
   microseconds per call. Run it once per source tree (``--label``) to compare two versions of the library: the
   ``--compare`` mode runs this script in a fresh process per tree, alternating trees, ``--repeats`` times.
2. ``graphed_step``'s check that the training state it captured is still the one in use (optimizer state,
   param_groups, parameter addresses, scaler, trainable flags): microseconds per check, and the step's time with
   the check against without it.

    python benchmarks/core_overhead.py --out /tmp/o                       # this tree
    python benchmarks/core_overhead.py --compare old/ . --out /tmp/o      # two trees, alternating processes
    python benchmarks/core_overhead.py --baseline old/ --out /tmp/o       # two trees in one process, alternating rounds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn


def mlp() -> nn.Module:
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(256, 256), nn.GELU())])


def models() -> dict[str, tuple[nn.Module, torch.Tensor]]:
    found = {"mlp-8-layers": (mlp(), torch.randn(8, 256))}
    try:
        import timm

        found["resnet18"] = (timm.create_model("resnet18", pretrained=False), torch.randn(1, 3, 224, 224))
    except ImportError:
        pass
    return found


def hand_replay(model: nn.Module, x: torch.Tensor):
    from launchless import own_blas_workspaces

    static = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            model(static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with own_blas_workspaces(), torch.cuda.graph(graph):  # wrap's captures empty PyTorch's shared workspaces
        out = model(static)

    def replay(inp: torch.Tensor) -> torch.Tensor:
        static.copy_(inp)
        graph.replay()
        return out.clone()

    return replay


def wrapper_overhead(label: str, rounds: int) -> list[dict]:
    import launchless as ll
    from launchless.timing import host_overhead_us  # present in both trees

    rows = []
    for name, (model, x) in models().items():
        model = model.cuda().eval()
        x = x.cuda()
        for mode_name, mode in (("no_grad", torch.no_grad), ("inference_mode", torch.inference_mode)):
            with mode():
                try:
                    m = ll.wrap(model, cuda_graph=True)
                    m(x)  # captures and verifies
                except Exception as exc:  # an older tree may not capture in this grad mode
                    rows.append({"tree": label, "model": name, "grad_mode": mode_name, "error": str(exc)[:200]})
                    continue
                replay = hand_replay(model, x)

                def wrapped(m=m, x=x):
                    return m(x)

                def by_hand(replay=replay, x=x):
                    return replay(x)

                us = [host_overhead_us(wrapped, by_hand, rounds=rounds) for _ in range(3)]
                rows.append({"tree": label, "model": name, "grad_mode": mode_name, "wrapper_us": statistics.median(us)})
                m.release_graphs()
    return rows


def load_as(tree: str, name: str):
    """The ``launchless`` package of another source tree, imported under ``name`` next to this one (its modules
    import each other relatively), so both run in one process and can be timed in alternating rounds."""
    import importlib.util

    init = Path(tree) / "launchless" / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def against_baseline(tree: str, rounds: int) -> list[dict]:
    """Extra Python microseconds per call of this tree's ``wrap`` over ``tree``'s, in alternating rounds of one
    process (``no_grad``: the older tree may not capture under ``inference_mode``)."""
    import launchless as ll
    from launchless.timing import host_overhead_us

    before = load_as(tree, "launchless_before")
    rows = []
    for name, (model, x) in models().items():
        model, x = model.cuda().eval(), x.cuda()
        with torch.no_grad():
            new, old = ll.wrap(model, cuda_graph=True), before.wrap(model, cuda_graph=True)
            new(x), old(x)  # capture and verify both
            replay = hand_replay(model, x)

            def call_new(m=new, x=x):
                return m(x)

            def call_old(m=old, x=x):
                return m(x)

            def by_hand(replay=replay, x=x):
                return replay(x)

            rows.append(
                {
                    "model": name,
                    "grad_mode": "no_grad",
                    "after_minus_before_us": [host_overhead_us(call_new, call_old, rounds=rounds) for _ in range(5)],
                    "after_minus_hand_us": [host_overhead_us(call_new, by_hand, rounds=rounds) for _ in range(5)],
                    "before_minus_hand_us": [host_overhead_us(call_old, by_hand, rounds=rounds) for _ in range(5)],
                }
            )
    return rows


def training_check(rounds: int) -> list[dict]:
    import launchless as ll

    rows = []
    for name, (model, x) in models().items():
        for opt_name in ("SGD", "AdamW"):
            net = model.cuda().train()
            opt = (
                torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
                if opt_name == "SGD"
                else torch.optim.AdamW(net.parameters(), lr=1e-3)
            )
            xb = x.cuda()

            def step(batch: torch.Tensor, net=net, opt=opt) -> torch.Tensor:
                opt.zero_grad(set_to_none=True)
                loss = net(batch).float().square().mean()
                loss.backward()
                opt.step()
                return loss

            graphed = ll.graphed_step(step, model=net, optimizer=opt)
            for _ in range(5):
                graphed(xb)
            info = graphed.graph_info()
            guard = graphed._state
            n = 20000
            start = time.perf_counter()
            for _ in range(n):
                guard.stale()
            check_us = (time.perf_counter() - start) / n * 1e6
            cache = graphed._cache
            saved = cache.guards
            times = {}
            for label, guards in (("with_check", saved), ("without_check", [])) * rounds:
                cache.guards = guards
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(50):
                    graphed(xb)
                torch.cuda.synchronize()
                times.setdefault(label, []).append((time.perf_counter() - t0) / 50 * 1e3)
            cache.guards = saved
            rows.append(
                {
                    "model": name,
                    "optimizer": opt_name,
                    "level": info["level"],
                    "check_us": check_us,
                    "step_ms_with_check": statistics.median(times["with_check"]),
                    "step_ms_without_check": statistics.median(times["without_check"]),
                }
            )
    return rows


def compare(trees: list[str], repeats: int, rounds: int, out: Path) -> list[dict]:
    rows = []
    for r in range(repeats):
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
            done = subprocess.run(
                [sys.executable, __file__, "--label", f"{tree}#{r}", "--rounds", str(rounds), "--only-wrapper"],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            line = [x for x in done.stdout.splitlines() if x.startswith("[")]
            if not line:
                rows.append({"tree": tree, "repeat": r, "error": done.stderr[-2000:]})
                continue
            rows.extend({**row, "tree": tree, "repeat": r} for row in json.loads(line[-1]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default=".")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare", nargs="*", help="source trees to compare, run alternately")
    parser.add_argument("--baseline", help="a source tree to time against this one in one process")
    parser.add_argument("--only-wrapper", action="store_true")
    parser.add_argument("--out")
    a = parser.parse_args()
    if a.only_wrapper:
        print(json.dumps(wrapper_overhead(a.label, a.rounds)))
        return
    from launchless.apps.environment import describe

    result: dict = {"environment": describe()}
    if a.baseline:
        result["against_baseline"] = against_baseline(a.baseline, a.rounds)
    if a.compare:
        result["wrapper"] = compare(a.compare, a.repeats, a.rounds, Path(a.out or "."))
    else:
        result["wrapper"] = wrapper_overhead(a.label, a.rounds)
    result["training_check"] = training_check(rounds=5)
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "core_overhead.json").write_text(text)


if __name__ == "__main__":
    main()
