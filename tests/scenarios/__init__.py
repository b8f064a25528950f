"""Planted truth of synthetic traces (gputrace.trace.builder).
"""
