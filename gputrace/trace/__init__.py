"""The trace format: a trace directory's files (`files`), its manifest (`manifest`), writing
(`writer`, `output`), reading (`reader`), raw parts (`rawparts`) and synthetic traces
(`builder`).

Imports neither bcc nor the analysis stack on the recording path (tests/test_import_graph.py):
`manifest` (pydantic) is imported only where a trace is read.
"""
