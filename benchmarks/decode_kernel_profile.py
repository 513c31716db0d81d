"""Where a decode step's time goes, per mode of the serving suite: kernels launched and GPU kernel time per new token
(the kernel floor: what no launch saving can remove) against the wall time per token, from one greedy generate() of
128 tokens under torch.profiler after two warm calls. One (workload, mode) per process, as the serving suite runs them.

    PYTHONPATH=. python benchmarks/decode_kernel_profile.py decode:llama-850m@b1 launchless --out profile.jsonl
"""

import argparse
import collections
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from launchless.apps.bench.serving_decode import decoding
from launchless.apps.bench.serving_workloads import build_decoder, decode_workload

NEW_TOKENS = 128
TOP_KERNELS = 12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("mode", choices=("eager", "static-compile", "launchless"))
    parser.add_argument("--out", required=True, help="JSON-lines file the row is appended to")
    args = parser.parse_args()
    model, prompt = build_decoder(decode_workload(args.workload), device=torch.device("cuda"))
    request = {**prompt, "max_new_tokens": NEW_TOKENS, "do_sample": False}
    generate = decoding(args.mode, model).generate
    for _ in range(2):  # compilation, capture and verification happen here
        generate(**request)
    torch.cuda.synchronize()
    began = time.perf_counter()
    generate(**request)
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - began) * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        generate(**request)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: collections.Counter[str] = collections.Counter()
    for event in kernels:
        by_name[event.name[:70]] += event.device_time
    row = {
        "workload": args.workload,
        "mode": args.mode,
        "wall_ms_per_token": wall_ms / NEW_TOKENS,  # the prompt's forward included
        "kernels_per_token": len(kernels) / NEW_TOKENS,
        "kernel_ms_per_token": sum(e.device_time for e in kernels) / 1e3 / NEW_TOKENS,
        "top_ms_per_token": [(name, round(us / 1e3 / NEW_TOKENS, 4)) for name, us in by_name.most_common(TOP_KERNELS)],
    }
    print(json.dumps(row))
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
