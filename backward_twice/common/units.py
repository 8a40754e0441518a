"""Byte counts as every report and notebook prints them, and counts of things as the reports print them."""

from __future__ import annotations

__all__ = ["format_bytes", "plural"]


def format_bytes(n: int) -> str:
    """``1536`` -> ``'1.5 KiB'``; exact bytes below 1 KiB.

    Used by notebooks 01_graph_buffers, 02_multi_loss, 03_gan_step, 04_carried_state and 06_real_stack.
    """
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def plural(count: int, word: str) -> str:
    """``plural(2, "note")`` -> ``'2 notes'``; ``plural(1, "note")`` -> ``'1 note'``."""
    return f"{count} {word}{'' if count == 1 else 's'}"
