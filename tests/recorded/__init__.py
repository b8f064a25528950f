"""Recorded fixtures: traces of real probes (stand-in and real H200).
"""
