"""Batch schedulers: continuous batching (vLLM v1-like) and static request-level batching."""
