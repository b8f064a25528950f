"""Tests of gputrace.render.
"""
