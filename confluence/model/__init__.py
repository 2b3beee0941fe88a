"""The relational transformer (seeds 000, 001, 002, 004) in JAX."""
