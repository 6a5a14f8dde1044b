"""Errors that name the file and the problem, for one-line messages."""

from __future__ import annotations


class TraceFormatError(Exception):
    """A file could not be read: it names the file and says what is wrong with it."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class SchemaVersionError(TraceFormatError):
    """A file was written by a newer major schema version than this reader knows."""
