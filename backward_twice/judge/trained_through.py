"""A graph carried by the only way a loss trains anything: a detach there would leave the loss nothing to train
(REINFORCE's log-probs of an episode, kept in a list and sampled again for a second update, pytorch/examples#151:
``-log_prob.detach() * R`` has no gradient, and its backward raises). The fix computes the carried values again in
the iteration that walks them, from inputs the learner keeps.

Used by :mod:`backward_twice.judge.carried` and :mod:`backward_twice.judge.fixes`.
"""

from __future__ import annotations

import re

from backward_twice.record.learner import lines_of_file, site_of

__all__ = ["appended_to", "computed_again_fix", "without_a_detach"]


def appended_to(whole: str, built_at: str) -> tuple[str, int] | None:
    """What the line ``built_at`` (else the first line of its file that does) appends to the list ``whole``, with that
    line's number: the ``m.log_prob(action)`` of ``policy.saved_log_probs.append(m.log_prob(action))``."""
    grown = re.compile(rf"(?<![\w.]){re.escape(whole)}\.append\((.+)\)\s*$")
    site = site_of(built_at)
    appended = grown.search(built_at.split(": ", 1)[-1])
    if appended is not None:
        return appended.group(1), site[1] if site is not None else 0
    found = ((n, grown.search(text)) for n, text in enumerate(lines_of_file(built_at), 1))
    return next(((match.group(1), n) for n, match in found if match is not None), None)


def computed_again_fix(name: str, container: str | None, built_at: str) -> str:
    """The fix where the loss trains only through ``name``'s graph of an earlier pass: compute it again where it is
    walked, not a detached copy."""
    site = site_of(built_at)
    item = re.match(r"^(.*)\[[^\]]*\]$", name)
    if item and container == "list":
        whole = item.group(1)
        appended = appended_to(whole, built_at)
        what = f"`{appended[0]}` (line {appended[1]})" if appended else f"the items of `{whole}`"
        return (
            f"compute {what} again in the iteration that walks it, from inputs you keep: the loss trains through "
            f"nothing else, so detached copies in `{whole}` would train nothing"
        )
    line = site[1] if site is not None else "?"
    return (
        f"compute `{name}` (line {line}) again in each iteration that walks it: the loss trains through nothing "
        f"else, so `{name}.detach()` would train nothing"
    )


def without_a_detach(fix: str, name: str, container: str | None, built_at: str, built_before: bool) -> str:
    """``fix`` for a carrier the loss trains only through, without a detach: an alternative detach it offers (``(or
    `x.detach()`, if it needs no gradient)``: it needs one) dropped, and a fix that detaches (``keep detached copies``,
    ``add `x = x.detach()```) replaced by :func:`computed_again_fix`; one that computes it afresh is right as it is.
    ``built_before``: a graph built before the loop (not a list), whose fix computes it inside the loop already."""
    alternative = fix.find(" (or `")
    if alternative > 0 and ".detach()" in fix[alternative:] and fix.endswith(")"):
        return fix[:alternative]
    if not fix.startswith(("keep detached copies", "add `")) or ".detach()" not in fix:
        return fix
    if container != "list" and built_before:
        return fix
    return computed_again_fix(name, container, built_at)
