"""What a run needs from its machines: the mesh and shardings, the multi-process start, clean stops, the run
directory lock, the compilation cache and batch prefetching."""
