"""Tests of gputrace.importers.
"""
