"""Tests of the command line (gputrace.cli, gputrace.commands).
"""
