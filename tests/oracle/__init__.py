"""A plain-Python reference of vLLM V1's scheduler, KV-cache manager and block pool (issue 36, "An oracle from
vLLM, not from the engine"), written from vLLM's own files and compared with the engine step by step
(tests/test_oracle.py). Nothing here imports or copies the engine's scheduling code."""
