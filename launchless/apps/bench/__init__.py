"""`launchless bench`: eager, torch.compile, reduce-overhead, a hand-written graph and launchless side by
side, each mode in its own process, with the kernel floor, tables and a chart."""
