"""Graph memory under ever-new batch sizes with max_graphs=2: the private pool's reserved and allocated bytes, and
the live CUDAGraph objects, after each new shape -- wrap against hand-written graphs in one shared pool.

    PYTHONPATH=. python benchmarks/graph_memory_under_new_shapes.py
"""

import gc

import torch
from torch import nn

import launchless as ll

MiB = 1 << 20


def pools():
    tot, alloc, n = 0, 0, 0
    for seg in torch.cuda.memory_snapshot():
        if tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0):
            tot += seg["total_size"]
            alloc += seg["allocated_size"]
            n += 1
    return tot, alloc, n


def live_graphs():
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.cuda.CUDAGraph))


def settle():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256)).cuda().eval()


def scenario(label, **kw):
    model = mlp()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1, max_graphs=2, **kw)
    rows_log = []
    for rows in range(1000, 972, -1):
        x = torch.randn(rows, 256, device="cuda")
        with torch.no_grad():
            m(x)
        settle()
        t, a, n = pools()
        rows_log.append((rows, t // MiB, a / MiB, n, live_graphs()))
    print(label, m.graph_info()["evictions"], "evictions")
    for r in rows_log[::3]:
        print("  rows {} pool total {} MiB allocated {:.2f} MiB segments {} live CUDAGraph {}".format(*r))
    del m
    settle()


def manual(shared=True, free_outputs=True):
    model = mlp()
    pool = torch.cuda.graph_pool_handle()
    held = []
    log = []
    for rows in range(1000, 972, -1):
        x = torch.randn(rows, 256, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad():
            with torch.cuda.stream(s):
                model(x)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool if shared else None):
                y = model(x)
        held.append((g, y, x))
        if len(held) > 2:
            held.pop(0)
        settle()
        log.append((rows, *pools()))
    print(f"manual shared={shared}")
    for r in log[::3]:
        print("  rows {} pool total {} B allocated {} B segments {}".format(*r))
    del held
    settle()


torch.cuda.init()
scenario("wrap default")
scenario("wrap verify=off", verify="off")
manual(True)
manual(False)
