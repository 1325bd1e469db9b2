"""Fake hardware for machines without it: NVML and GPU hosts of known models, nvidia-smi,
the MPS control daemon, sysfs and device-node trees. Real enough that the code under
test cannot tell (pynvml's own types and errors, the kernel's file layout), so product
code may use it too (the fleet's and the planner's simulated GPUs); `devplug.testing`
builds on it. It stands on the ground floor alone."""
