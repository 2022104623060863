"""Compiling for NVIDIA GPUs that are not here (ahead of time, deviceless): the GPU targets and their specs, their
compile-only devices, reading the compiled program's optimized HLO (kernels, GEMM kinds, collectives, bytes), and a
roofline estimate of its time. Nothing here knows the trainer: MaxText/trainer/aot_step.py compiles its step."""
