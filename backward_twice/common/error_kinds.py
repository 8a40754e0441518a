"""The errors the tool and the course are about, named by their kind from PyTorch's message (for reports and
panels): a message matched by the text that identifies it, so a reworded message of the same check is listed too."""

from __future__ import annotations

__all__ = ["ERROR_KINDS", "LEAF_IN_PLACE", "about_autograd", "error_kind"]

# (kind, the text of PyTorch's message that identifies it)
ERROR_KINDS = (
    ("backward a second time", "backward through the graph a second time"),
    ("in-place version error", "modified by an inplace operation"),
    # the same version check, worded for a saved output of a multi-output view (unbind, split, chunk)
    ("in-place version error", "its base or another view of its base has been modified inplace"),
    ("no graph", "does not require grad and does not have a grad_fn"),
    # torch.compile's backward, compiled for one use: at a first call that did not retain, or ahead of time
    # under dynamic shapes (notebook 06, section 2)
    ("donated buffers", "compiled with non-empty donated buffers"),
    # DistributedDataParallel with two backward calls per step, and the two "fixes" people try
    # (static_graph=True; find_unused_parameters=True with zero_grad's set_to_none) (notebook 06, section 3)
    ("DDP ready only once", "Expected to mark a variable ready only once"),
    ("DDP ready only once", "Your training graph has changed in this iteration"),
    ("DDP ready only once", "Encountered gradient which is undefined, but still allreduced"),
)


# a parameter's in-place update where autograd records (an EMA written without torch.no_grad()): a kind of its own
LEAF_IN_PLACE = "a leaf Variable that requires grad is being used in an in-place operation"


def about_autograd(message: str) -> bool:
    """Whether the message is one of the autograd errors the tools judge (a kind above, or a leaf changed in place),
    wherever the code raised it: a training error, not the script's own."""
    return error_kind(message) != "other" or LEAF_IN_PLACE in message


def error_kind(message: str) -> str:
    """The kind of error a message reports: one of :data:`ERROR_KINDS`' kinds, or "other"."""
    return next((kind for kind, text in ERROR_KINDS if text in message), "other")
