"""Show an error a lesson expects, and fail loudly when it stops happening.

A notebook cell tagged ``raises-exception`` only *allows* an error; if a new torch release stopped
raising it, the lesson would go on teaching something false and every test would stay green.
:func:`expect_error` turns the demo into a check: the real message is shown, and no error is an
``AssertionError`` (a lesson that shows an error fails its tests the day PyTorch stops raising it).

Used by notebooks 01_graph_buffers, 02_multi_loss, 03_gan_step, 04_carried_state and 06_real_stack.
"""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["ExpectedError", "expect_error"]


@dataclass
class ExpectedError:
    """What :func:`expect_error` caught: the exception type name and its full message (every notebook)."""

    type_name: str = ""
    message: str = ""
    exception: BaseException | None = field(default=None, repr=False)


def _add_note(exc: BaseException, note: str) -> None:
    """Attach ``note`` to ``exc``, shown under its traceback (Python 3.11+; 3.10 has no notes: the error alone)."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)


@contextmanager
def expect_error(
    error_type: type[BaseException] = Exception,
    match: str | None = None,
    show: bool = True,
    width: int = 100,
) -> Iterator[ExpectedError]:
    """Run the block, require it to raise ``error_type`` (with ``match`` in its message), show it.

    ``match`` is a regular expression searched in the message. The caught error's type and
    message are printed (wrapped to ``width`` columns) and stored in the yielded record.
    No error raises ``AssertionError``; an error of another type or message is re-raised, with a
    note saying what was expected, so a broken demo never passes silently.

    Example::

        with expect_error(RuntimeError, match="backward through the graph a second time"):
            loss.backward()

    Used by notebooks 01_graph_buffers, 02_multi_loss, 03_gan_step, 04_carried_state and 06_real_stack.
    """
    if not (isinstance(error_type, type) and issubclass(error_type, BaseException)):
        raise TypeError(f"expect_error() needs an exception class, not {error_type!r}.")
    if match is not None and not isinstance(match, str):
        raise TypeError(f"expect_error(match=...) takes a regular expression string, not {type(match).__name__}.")
    wanted = error_type.__name__ + (f" matching {match!r}" if match else "")
    record = ExpectedError()
    try:
        yield record
    except error_type as exc:
        message = str(exc)
        if match is not None and re.search(match, message) is None:
            _add_note(exc, f"expect_error: expected {wanted}, but the message did not match.")
            raise
        record.type_name = type(exc).__name__
        record.message = message
        record.exception = exc
        if show:
            print(f"Raised, as expected: {record.type_name}")
            for paragraph in message.splitlines() or [""]:
                print(textwrap.fill(paragraph, width=width, initial_indent="  ", subsequent_indent="  "))
    except BaseException as exc:
        _add_note(exc, f"expect_error: expected {wanted}, got {type(exc).__name__} instead.")
        raise
    else:
        raise AssertionError(
            f"Expected {wanted}, but the code ran without error. The lesson depends on this "
            "error: if a new PyTorch version no longer raises it, the text around this cell "
            "must change."
        )
