"""Tests of gputrace.analyses.
"""
