"""kvsim: a capacity simulator for LLM serving whose subject is the KV cache."""

__version__ = "0.1.0"
