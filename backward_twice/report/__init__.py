"""Reporting: the diagnosis as a learner reads it (text, HTML, JSON), built from the verdicts."""
