"""Tests of gputrace.live (no recording).
"""
