"""Tests of gputrace.trace.
"""
