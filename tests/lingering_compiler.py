"""A compiler process that, after its program is ready, lingers as a process whose exit is slow does (Inductor's
compile workers joined, a GPU context torn down): for ``test_compiled_programs``."""

import sys
import time

from launchless.core.compiler_process import compile_program

if __name__ == "__main__":
    compile_program(sys.argv[1], sys.argv[2], float(sys.argv[3]), kept_in=sys.argv[4])
    time.sleep(float(sys.argv[5]) if len(sys.argv) > 5 else 120.0)
