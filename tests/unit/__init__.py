"""Unit tests, one folder per gputrace package.
"""
