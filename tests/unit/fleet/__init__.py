"""Tests of gputrace.fleet.
"""
