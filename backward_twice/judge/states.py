"""A state a carried graph's fix detaches whole: every tensor of a dict, list or tuple at once, with
``torch.utils._pytree.tree_map``, where detaching one entry would leave another holding the graph (a memory's last
state also appended to its history; an NTM's ``previous_state = (reads, (h, c), heads)``, whose tuple items cannot be
assigned).

Used by :mod:`backward_twice.judge.carried`, :mod:`backward_twice.judge.fixes` and :mod:`backward_twice.judge.verdicts`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from backward_twice.record.learner import lines_of_file
from backward_twice.record.names import NamedGraph

__all__ = ["as_spelled_in_its_methods", "one_state", "whole_name", "whole_state", "whole_state_fix"]


def one_state(node: NamedGraph, rebound_each_pass: Callable[[str], bool]) -> str | None:
    """The dict or list that holds ``node`` under two or more of its entries (``net.mem`` of ``net.mem['h']`` and
    ``net.mem['past'][0]``, a memory's last state also appended to its history): the whole state is what to detach,
    as a detach of one entry leaves the graph in the other. Another name of it that each pass rebinds before it
    reads it (``rebound_each_pass``: the loop's ``h``) carries nothing. None when its spellings share no such
    state."""
    spellings = {node.name, *node.same}
    items = {spelled for spelled in spellings if re.fullmatch(r"[\w.]+(?:\[[^\]]+\])+", spelled)}
    others = spellings - items  # keys and positions only: an object's attribute inside (``state['loader'].labels``)
    roots = {spelled.split("[", 1)[0] for spelled in items}  # is out of a tree_map's reach
    if len(items) < 2 or len(roots) != 1 or any("[" in other or not rebound_each_pass(other) for other in others):
        return None
    return roots.pop()


def as_spelled_in_its_methods(name: str) -> list[str]:
    """``name`` and, for an attribute chain, the same attribute as its object's methods spell it (``atk.delta``:
    ``self.delta``), the spelling the lines that grow or read it use."""
    return [name, f"self.{name.split('.', 1)[1]}"] if "." in name else [name]


def whole_name(name: str, container: str | None) -> str:
    """``state`` of ``state[0]`` when the name is an item of a tuple or a list, or an entry of a dict by a number (a
    memory kept per node id): what the loop reads and rebinds."""
    return re.sub(r"\[\d+\]$", "", name) if container in ("tuple", "list", "dict") else name


def whole_state(name: str, container: str | None, built_at: str) -> str | None:
    """The state a carried graph's fix detaches whole, every tensor in it: a dict that holds the tensor under two
    entries (``container`` "state": a memory's last state, also appended to its history), or the root of an item of an
    item by position of tuples and lists rebuilt each pass (an NTM's ``previous_state = (reads, (h, c), heads)``: an
    item of a tuple cannot be assigned). None for any other carrier."""
    if container == "state":
        return name
    nested = re.fullmatch(r"(.*?)((?:\[\d+\]){2,})", name)
    if nested and container in ("tuple", "list") and not _appended_to(name, built_at):
        return nested.group(1)
    return None


def whole_state_fix(root: str) -> str:
    """The fix that detaches every tensor of the state ``root``, whatever its shape of tuples, lists and dicts."""
    detached = f"torch.utils._pytree.tree_map(lambda t: t.detach() if torch.is_tensor(t) else t, {root})"
    return f"add `{root} = {detached}` at the end of each iteration"


def _appended_to(item: str, built_at: str) -> bool:
    """Whether the file of ``built_at`` grows a list ``item`` is in, at any depth (``memory[2].append(...)``,
    ``+= [...]``), spelled as the loop spells it or as a method of its owner does (``self.memory.append(...)`` for
    ``memory.memory``: a DQN's replay memory)."""
    holders: set[str] = set()
    spelled = item
    while (outer := re.fullmatch(r"(.*)\[[^\]]*\]", spelled)) is not None:
        spelled = outer.group(1)
        holders.update(as_spelled_in_its_methods(spelled))
    if not holders:
        return False
    either = "|".join(re.escape(holder) for holder in sorted(holders))
    grown = re.compile(rf"(?<![\w.])(?:{either})\s*(\.append\(|\.appendleft\(|\.extend\(|\.insert\(|\+=)")
    return any(grown.search(text) for text in lines_of_file(built_at))
