"""``launchless cache``: what launchless keeps on disk, listed or removed -- the programs ``kernels="compiled"``
compiled (a second process reads them instead of compiling), the records of a package loader that crashed on a
machine (they keep programs in Inductor's format there), and the compiler backend's graph decisions.

Removing is safe while nothing compiles: a program already read stays in its process's memory; a compile in flight
writes its program when it ends."""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..compiler.decisions import DecisionCache
from ..core.compiled_programs import KeptProgram, ProgramFormat, cache_dir, kept_programs, stray_files
from ..core.package_check import loader_crashed_here, loader_records
from .bench.formatting import byte_size

FORMAT_NAMES: dict[str, str] = {
    ProgramFormat.PACKAGE: "AOTInductor package",
    ProgramFormat.ARTIFACT: "Inductor's format",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    cache = sub.add_parser(
        "cache",
        help="list (or remove) the compiled programs, package-loader records and graph decisions kept on disk",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = cache.add_mutually_exclusive_group()
    what.add_argument("--clear", action="store_true", help="remove all of them")
    what.add_argument(
        "--forget-loader",
        action="store_true",
        help="remove only the records of a package loader that crashed (packages are built and checked again)",
    )


def run(args: argparse.Namespace, *, console: Console | None = None) -> int:
    console = console or Console()
    folder, decisions = cache_dir(), DecisionCache()
    if args.clear or args.forget_loader:
        records = loader_records(folder)
        for record in records:
            record.unlink(missing_ok=True)
        if args.forget_loader:
            console.print(f"removed {len(records)} package-loader record(s) from {escape(str(folder))}")
            return 0
        programs, strays = kept_programs(folder), stray_files(folder)
        freed = sum(kept.size_bytes for kept in programs) + sum(path.stat().st_size for path in strays)
        for path in [*(path for kept in programs for path in kept.files), *strays]:
            path.unlink(missing_ok=True)
        cleared = decisions.clear()
        console.print(
            f"removed {len(programs)} compiled program(s) ({byte_size(freed)}) and {len(records)} package-loader "
            f"record(s) from {escape(str(folder))}, and {cleared} graph decision(s) from "
            f"{escape(str(decisions.directory))}"
        )
        return 0
    _list(console, folder, decisions)
    return 0


def _list(console: Console, folder: Path, decisions: DecisionCache) -> None:
    programs = kept_programs(folder)
    console.print(f"compiled programs in {escape(str(folder))}: {len(programs)}")
    if programs:
        table = Table("program", "for", "kept as", "size", "written")
        for kept in programs:
            table.add_row(kept.path.name, _purpose(kept), _format(kept), byte_size(kept.size_bytes), _when(kept))
        console.print(table)
    strays = stray_files(folder)
    if strays:
        console.print(f"files of programs not kept (nothing reads them): {len(strays)}")
    reasons = sorted({kept.unpackaged for kept in programs if kept.unpackaged})
    for reason in reasons:  # why inference programs are not packages (a second process reads them in seconds)
        console.print(f"not a package: {escape(reason)}")
    for record in loader_records(folder):
        console.print(f"package loader record {escape(record.name)}: {escape(loader_crashed_here(record) or '')}")
    console.print(f"graph decisions in {escape(str(decisions.directory))}: {len(decisions)}")


def _purpose(kept: KeptProgram) -> str:
    return "?" if kept.training is None else ("training" if kept.training else "inference")


def _format(kept: KeptProgram) -> str:
    if kept.training is None:
        return "no readable plan (removed, or of another launchless): compiled again when asked for"
    return FORMAT_NAMES.get(kept.format, kept.format)


def _when(kept: KeptProgram) -> str:
    return datetime.datetime.fromtimestamp(kept.modified).strftime("%Y-%m-%d %H:%M")
