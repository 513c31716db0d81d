"""Compiler processes that behave as real ones do at their edges, for ``test_compiled_programs``; which one, the
environment's ``LAUNCHLESS_TEST_COMPILER`` says:

- ``linger``: after its programs are written it lingers, as a process whose exit is slow does (Inductor's compile
  workers joined, a GPU context torn down);
- ``slow-package``: its package takes minutes after Inductor's format (a process that exits meanwhile ends it);
- ``no-package``: AOTInductor cannot build a package (its host code's headers are missing).
"""

import os
import sys
import time

import torch

from launchless.core import compiler_process
from launchless.core.compiled_programs import INDUCTOR_FIRST

VARIANT = os.environ.get("LAUNCHLESS_TEST_COMPILER", "")


def _slow_package(*args: object, **kwargs: object) -> str:
    time.sleep(120.0)
    return PACKAGE_OR_WHY(*args, **kwargs)


def _no_headers(*args: object, **kwargs: object) -> None:
    raise RuntimeError("cuda_runtime_api.h: No such file or directory")


if __name__ == "__main__":
    PACKAGE_OR_WHY = compiler_process._package_or_why
    if VARIANT == "slow-package":
        compiler_process._package_or_why = _slow_package
    elif VARIANT == "no-package":
        torch._inductor.aot_compile = _no_headers
    first = sys.argv[5] == INDUCTOR_FIRST
    compiler_process.compile_program(
        sys.argv[1], sys.argv[2], float(sys.argv[3]), kept_in=sys.argv[4], inductor_format_first=first
    )
    if VARIANT == "linger":
        time.sleep(120.0)
