"""Judging: verdicts from a finished recording, never from a modified run, with the fix in the learner's own names."""
