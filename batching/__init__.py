"""Batching explorer: a token-step simulator of LLM serving under batching policies."""
