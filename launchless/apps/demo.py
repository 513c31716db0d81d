"""`launchless demo`: wrap a real model, prove its graph, show the speed-up -- or, without a GPU,
show what would be captured and where capture would stop."""

from __future__ import annotations

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..core.signature import flatten_inputs, signature_of
from ..diagnose.dry_run import dry_run
from ..runtime import wrap
from ..timing import cuda_time
from . import zoo
from .environment import describe


def _without_cuda(console: Console, w: zoo.Workload) -> int:
    console.print(
        "[bold yellow]No CUDA device here[/]: launchless captures graphs only on a CUDA GPU, so "
        "nothing is captured or timed. What it would capture:"
    )
    table = Table(show_header=False)
    table.add_row("model", f"{w.name} ({type(w.model).__name__}, random weights)")
    table.add_row("parameters", f"{sum(p.numel() for p in w.model.parameters()):,}")
    table.add_row("input signature", signature_of(flatten_inputs(w.args, w.kwargs)).describe())
    with console.status("dry run on the meta device (finds what a capture could not record)"):
        blocker = dry_run(w.model, w.args, w.kwargs)
    if blocker is None:
        table.add_row("capture", "[green]no blocker found[/]: the whole forward would be one graph")
    else:
        table.add_row("capture would fail", f"[red]{blocker.describe()}[/]")
        table.add_row("fix", blocker.fix)
    console.print(table)
    console.print(
        "On a CUDA machine this command captures it, verifies replay bit for bit against eager, and times both."
    )
    return 0


def _with_cuda(console: Console, w: zoo.Workload, iters: int) -> int:
    env = describe()
    console.print(f"{env['gpu']} · driver {env['driver']} · torch {env['torch']} · CUDA {env['cuda']}")
    m = wrap(w.model, cuda_graph=True)
    args, kwargs = w.inputs()
    with torch.no_grad():
        with console.status("capturing and verifying"):
            info = m.capture_graph(*w.args, **w.kwargs)
        eager = cuda_time(lambda: w.model(*args, **kwargs), iters=iters)
        graphed = cuda_time(lambda: m(*args, **kwargs), iters=iters)
    report = info["verification"]
    table = Table(title=f"{w.name}, input {info['signature']}")
    for column in ("", "ms per call (median)", "speed-up"):
        table.add_column(column, justify="right")
    table.add_row("eager", f"{eager.median_ms:.3f}", "1.00×")
    table.add_row(
        "launchless graph", f"{graphed.median_ms:.3f}", f"[bold green]{eager.median_ms / graphed.median_ms:.2f}×[/]"
    )
    console.print(table)
    diff = "" if report["status"] == "bit-identical" else f" (max abs diff {report['max_abs_diff']:.3g})"
    console.print(
        f"verification: [bold]{report['status']}[/]{diff} on two probes; capture took {info['capture_ms']:.0f} ms"
    )
    return 0


def run(name: str = "timm:resnet18", batch: int = 1, iters: int = 100) -> int:
    console = Console()
    if not zoo.available(name):
        console.print(f"[red]{name} needs its model library[/]: " + escape("pip install 'launchless[zoo]'"))
        return 1
    cuda = torch.cuda.is_available()
    with console.status(f"building {name} with random weights"):
        w = zoo.build(name, batch=batch, device="cuda" if cuda else "cpu")
    return _with_cuda(console, w, iters) if cuda else _without_cuda(console, w)
