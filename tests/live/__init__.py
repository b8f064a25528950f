"""Live tests: real BPF probes (root, bcc) and the FUSE stand-ins.
"""
