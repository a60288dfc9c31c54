"""Errors raised in more than one layer, defined below them all so that no layer imports another only to subclass
one of its errors.

LogError: the log of a run cannot be used. edgeinfer/logs raises it for a file that is missing or malformed (the
message names the file and the 1-based line or record); control/limits.py's JointCountError is one too, for a log
whose joint count is not the policy's or the limits': either way the run cannot start on that log, and a caller
that catches LogError (`except LogError`) refuses the run the same way. It is edgeinfer.logs.LogError (re-exported
there, where the readers' callers import it).
"""
from __future__ import annotations


class LogError(ValueError):
    """A log file is missing or malformed, or cannot be used with this policy and these limits; the message names the
    file and the 1-based line (or the counts that differ, and where each comes from)."""
