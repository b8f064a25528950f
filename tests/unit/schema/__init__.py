"""Tests of gputrace.schema.
"""
