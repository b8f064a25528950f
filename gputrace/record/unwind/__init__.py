"""The API layer's native unwinder: .eh_frame compiled into rows the probe reads
(cfi.py), loaded per library and per process into its maps (tables.py);
probes/cuda_unwind.bpf.h walks them. docs/record.md "Native frames"."""
