"""A ``retain_graph=True`` a GAN's D loss needs only because it walks G's graph: DCGAN's ``errD_fake =
criterion(netD(fake), label)`` with the forum's ``errD_fake.backward(retain_graph=True)``, so that G's backward, on
``netD(fake)`` computed again after D's step, still finds G's buffers. Needed as written; with ``fake.detach()`` in
D's loss, D's backward walks nothing of G's and frees nothing G's backward needs, and the retain can go (D's loss must
not train G anyway).

Used by :mod:`backward_twice.judge.verdicts`.
"""

from __future__ import annotations

import linecache
import re

from backward_twice.judge.second_backward import D_LOSS, G_OUTPUT
from backward_twice.judge.uses import computed_through
from backward_twice.record.sources import parsed

__all__ = ["detach_in_the_d_loss"]


def detach_in_the_d_loss(retaining: tuple[str, int], needer: tuple[str, int]) -> tuple[str, int] | None:
    """(``fake``, the line of the D loss's statement that feeds it to D) where the backward at ``retaining`` is a GAN's
    D loss (``errD_fake``, ``d_loss``, ``loss_D``), the later one at ``needer``, in the same file, is not, and the later
    loss reads ``fake`` again after the D loss's backward (G's loss on its own ``netD(fake)``, not on D's output); None
    otherwise."""
    if retaining[0] != needer[0] or not D_LOSS.search(linecache.getline(*retaining)):
        return None
    if D_LOSS.search(linecache.getline(*needer)):
        return None
    tree = parsed(retaining[0])
    if tree is None:
        return None
    d_chain = computed_through(retaining[0], tree, retaining[1])
    g_chain = list(computed_through(needer[0], tree, needer[1]))
    for line, _ in d_chain:
        code = linecache.getline(retaining[0], line).split("#", 1)[0]
        spelled = re.findall(r"[\w.]+(?:\[['\"]\w+['\"]\])?", code) if line != retaining[1] else []
        fake = next((name for name in spelled if _a_generators_output(name) and _fed_to_d(code, name)), None)
        if fake is not None:  # G's loss on a D output of its own, computed after D's backward from ``fake``
            own = any(later > retaining[1] and _reads(later, reads, fake) for later, reads in g_chain)
            return (fake, line) if own else None
    return None


def _reads(line: int, reads: frozenset[str], spelled: str) -> bool:
    """Whether the statement at ``line`` reads ``spelled`` (``fake``; ``state["fake"]``, which ``reads`` spells with
    single quotes)."""
    return spelled in reads or spelled.replace('"', "'") in reads


def _fed_to_d(code: str, spelled: str) -> bool:
    """Whether ``code`` passes ``spelled`` to a discriminator (``netD(fake)``, ``self.D(state["fake"])``), not only
    reads it (``d_loss_fn(real_out, fake_out)`` reads D's output)."""
    d = r"(?:\bnet_?D\w*|(?<![\w.])D|\bdiscriminator\w*|\bcritic\w*|\.D)"
    return re.search(rf"{d}\s*\(\s*{re.escape(spelled)}\s*[,)]", code, re.IGNORECASE) is not None


def _a_generators_output(spelled: str) -> bool:
    """Whether the name as a line spells it (``fake``, ``self.fake_B``, ``state["fake"]``) is a generator's output by
    its last part, and no loss of D's (``errD_fake``)."""
    last = re.split(r"[.\[]", spelled.rstrip("]").replace('"', "").replace("'", ""))[-1]
    return G_OUTPUT.match(last) is not None and D_LOSS.search(last) is None
