"""`python -m gputrace.schema > docs/trace-format.md`."""

from gputrace.schema.markdown import render_markdown

print(render_markdown(), end="")
