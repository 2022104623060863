"""Training: the loop, the step functions, building a run, and the hooks the loop calls."""
