"""What the training loop calls around its steps: metrics, eval, checkpoints, the profiler, stops."""
