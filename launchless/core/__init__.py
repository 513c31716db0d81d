"""The graph core: the one place that captures, verifies, guards and replays CUDA graphs.

``capture`` is the only user of ``torch.cuda.CUDAGraph``; ``cache.GraphCache`` is the per-signature state
machine every entry point (``wrap``, ``graphed_step``, the compiler backend) runs its graphs through.
"""
