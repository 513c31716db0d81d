"""Device memory a serving mode's graphs hold over the serving suite's trace, three ways: what launchless counts
(``memory_budget()["held_bytes"]``: pool growth and static input buffers), the caching allocator's reserved growth,
and the driver's free memory lost (``cudaMemGetInfo``, which also sees the memory CUDA keeps for each instantiated
graph). Measured from a warm eager pass with cached blocks given back, to after the mode's pass with them given back
again. One (workload, mode) per process.

    PYTHONPATH=. python benchmarks/bucket_memory.py buckets:resnet18@64 graph-per-size --out memory.jsonl
"""

import argparse
import gc
import json

import torch

from launchless.apps.bench.serving_buckets import server
from launchless.apps.bench.serving_graphs import held_by_launchless
from launchless.apps.bench.serving_workloads import TRACE_CALLS, TRACE_SEED, batch_trace, bucket_builder

MiB = 1 << 20


def settled() -> tuple[int, int]:
    """(driver free bytes, reserved bytes) with the allocator's cached free blocks given back."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("mode", choices=("graph-per-size", "buckets", "buckets-auto"))
    parser.add_argument("--out", required=True, help="JSON-lines file the row is appended to")
    args = parser.parse_args()
    model, make_inputs = bucket_builder(args.workload)(device=torch.device("cuda"))
    torch.manual_seed(TRACE_SEED)
    trace = [make_inputs(rows) for rows in batch_trace(TRACE_CALLS)]
    with torch.no_grad():
        for call_args, call_kwargs in trace:
            model(*call_args, **call_kwargs)
        free_before, reserved_before = settled()
        mode_server = server(args.mode, model)
        for inputs in trace:
            mode_server.serve(inputs)
        free_after, reserved_after = settled()
    held = held_by_launchless(mode_server.wrapped)
    row = {
        "workload": args.workload,
        "mode": args.mode,
        "graphs": held.graphs,
        "held_mib": held.bytes / MiB,
        "reserved_mib": (reserved_after - reserved_before) / MiB,
        "driver_mib": (free_before - free_after) / MiB,
    }
    print(json.dumps(row))
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
