"""Errors a user can cause. The CLI prints them as one line and exits non-zero."""

from __future__ import annotations


class GputraceError(Exception):
    """A problem the user can act on; `str(err)` is the whole message."""

    exit_code = 1


class TraceError(GputraceError):
    """The trace directory is missing, unreadable, corrupt or too new."""


class UsageError(GputraceError):
    """A bad option or argument value."""

    exit_code = 2
