"""GPU, node and model presets, the cost model and its calibration."""
