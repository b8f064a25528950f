"""TEST STAND-IN: the stand-in libcuda and its known workload (see README.md)."""
