"""Batching explorer: a token-step simulator of LLM serving under batching policies."""
from batching.sim.engine import kernel_cache

kernel_cache.configure()
