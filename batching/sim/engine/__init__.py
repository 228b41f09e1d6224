"""The Numba token-step kernel: its loop, stages, state, speculation and compile cache."""
