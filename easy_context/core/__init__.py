"""The attention machinery every backend shares: the backend registry and its layout rules, blockwise attention and
the one fp32 LSE merge, the local-attention and distributed autograd functions, checkpoint-after-attention, the
cross-rank shape checks, process groups, packed documents (and their balancing over the ring), sliding windows,
padding and input sharding. The local kernels are ``easy_context.kernels``, the communication ``easy_context.comm``.
"""
