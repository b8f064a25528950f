"""Tests of gputrace.record that need no BPF.
"""
