"""Many engines in one run: fleets behind a router, prefill/decode splits."""
