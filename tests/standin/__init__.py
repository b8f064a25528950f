"""TEST STAND-IN for the NVIDIA driver (nvfuse + workload); see README.md."""
