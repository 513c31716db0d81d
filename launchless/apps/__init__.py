"""Applications built on the library: the command line, the demo, benchmarks, a small trainer, a model zoo."""
