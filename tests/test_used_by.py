"""Every "Used by" sentence in a helpers docstring names exactly the users the notebooks and the code give it.

Nothing here is a hand-written table; the users are derived by reading the code (``ast``) and the notebooks:

* **notebooks**: a notebook calls a def by name when its code cells say ``bt.NAME`` (``notebook_calls``) or import
  it from a helpers module (``from backward_twice.cli import main``). A def a notebook calls by name is used by the
  notebooks that call it; any other def (function, class, method, constant) by the notebooks that call a def whose
  code reaches it: the call graph, each def's names resolved through its module's own defs and its imports
  (type annotations and ``if TYPE_CHECKING:`` imports left out). A module is used by the notebooks that call a
  def defined in it, in a helpers module that imports it (directly or through others), or re-exported by the
  lesson package's ``__init__`` on the way to ``bt``.
* **code**: a module's users are the helpers modules that import it (a package's ``__init__`` only re-exports:
  it does not count); a def's users are the defs whose code names it (a method counts as its class unless the
  claim names the method).
* **learners**: a README section that names the def or module, or runs the module's console script.

A claim is one sentence (whitespace collapsed), in one or more groups joined by ", and by ":

    Used by notebook 04_carried_state.
    Used by notebooks 01_graph_buffers, 02_multi_loss and 04_carried_state.
    Used by :mod:`backward_twice.steps.harness` and :mod:`backward_twice.watcher`.                 (a module's
    importers)
    Used by :func:`ring_coverage`, :class:`GanLab` and :meth:`GanStepChecker.compare`.   (a def's code users)
    Used by notebook 05_your_training_step, and by learners on their own scripts (README, "SECTION").

Each kind a claim names it names exactly: all its notebooks, all its code users. A docstring that says "used by"
in any other form fails. A lesson's "What only notebook 04_carried_state uses" is a claim too: that notebook, and
no other, uses it.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TypeVar

import pytest
from test_architecture import notebook_calls

import helpers

ROOT = Path(__file__).resolve().parent.parent
HELPERS = ROOT / "helpers"
TOOL = ROOT / "backward_twice"
PACKAGES = ("backward_twice", "helpers")
NOTEBOOKS = ROOT / "notebooks"
README = ROOT / "README.md"
PYPROJECT = ROOT / "pyproject.toml"
T = TypeVar("T")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, ast.Module]:
    """Every module of the tool and of the course by dotted name -> its AST."""
    paths = sorted([*TOOL.rglob("*.py"), *HELPERS.rglob("*.py")])
    return {module_name(p): ast.parse(p.read_text(encoding="utf-8")) for p in paths}


@cache
def is_package(module: str) -> bool:
    return (ROOT / module.replace(".", "/") / "__init__.py").exists()


def runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and the nodes under it, leaving out type annotations and ``if TYPE_CHECKING:`` blocks: naming a
    type for the checker is not using it."""
    todo = [node]
    while todo:
        current = todo.pop()
        yield current
        for field, value in ast.iter_fields(current):
            if field in ("annotation", "returns"):
                continue
            if field == "body" and isinstance(current, ast.If) and "TYPE_CHECKING" in ast.unparse(current.test):
                continue
            todo.extend(
                child for child in (value if isinstance(value, list) else [value]) if isinstance(child, ast.AST)
            )


@cache
def imported_modules(module: str) -> set[str]:
    """The helpers modules ``module`` imports anywhere in its code (``from helpers.x import y`` names helpers.x,
    or helpers.x.y when that is a module)."""
    found = set()
    for node in runtime_nodes(modules()[module]):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found.update(n for n in names if n in modules())
    return found - {module}


@cache
def importers(module: str) -> set[str]:
    """The helpers modules that import ``module``; packages' ``__init__`` files only re-export, and do not count."""
    return {m for m in modules() if not is_package(m) and module in imported_modules(m)}


def closure(start: T, step: Callable[[T], Iterable[T]]) -> set[T]:
    """``start`` and everything ``step`` leads to from it, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(step(current))
    return seen


@cache
def reached_modules(module: str) -> set[str]:
    """``module`` and every helpers module it imports, directly or through others."""
    return closure(module, imported_modules)


Def = tuple[str, str]  # (module, qualified name: "f", "Cls" or "Cls.method")


@cache
def bindings(module: str) -> dict[str, Def]:
    """Each top-level name of ``module`` -> the def it is: its own, or the one it imports from another module."""
    tree = modules()[module]
    names: dict[str, Def] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = (module, node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update((t.id, (module, t.id)) for t in targets if isinstance(t, ast.Name))
    # imports anywhere: a function may import lazily; a package's ``if TYPE_CHECKING:`` imports are the names its
    # ``__getattr__`` exports lazily
    for node in ast.walk(tree) if is_package(module) else runtime_nodes(tree):
        if isinstance(node, ast.ImportFrom) and node.module in modules():
            for alias in node.names:
                names.setdefault(alias.asname or alias.name, (node.module, alias.name))
    return names


@cache
def resolve(definition: Def) -> Def:
    """Follow re-exports (``from helpers.x import y`` in a package's ``__init__``) to where a name is defined."""
    module, name = definition
    head = name.split(".")[0]
    target = bindings(module).get(head)
    if target is None or target[0] == module:
        return definition
    return resolve((target[0], target[1] + name[len(head) :]))


def defs(module: str) -> Iterator[tuple[str, ast.AST]]:
    """Top-level functions, classes and constants, and methods, as (qualified name, node)."""
    for node in modules()[module].body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            yield node.name, node
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{node.name}.{item.name}", item
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    yield target.id, node


@cache
def references() -> dict[Def, set[Def]]:
    """Each def -> the defs its code names. A class names what its body names outside its methods (its bases,
    its class attributes) and its methods; a method names ``self.other`` methods of its class."""
    graph: dict[Def, set[Def]] = {}
    known = {(m, q) for m in modules() for q, _ in defs(m)}
    for module in modules():
        names = bindings(module)
        for qualname, node in defs(module):
            cls = qualname.split(".")[0] if "." in qualname else None
            body = node
            if isinstance(node, ast.ClassDef):  # the class: its methods, and its own lines outside them
                methods = [i for i in node.body if isinstance(i, ast.FunctionDef | ast.AsyncFunctionDef)]
                named = {(module, f"{node.name}.{m.name}") for m in methods}
                body = ast.Module(body=[*node.bases, *(i for i in node.body if i not in methods)], type_ignores=[])
            else:
                named = set()
            for sub in runtime_nodes(body):
                if isinstance(sub, ast.Name) and sub.id in names:
                    named.add(resolve(names[sub.id]))
                elif (
                    cls
                    and isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id in ("self", "cls")
                ):
                    named.add((module, f"{cls}.{sub.attr}"))
            graph[(module, qualname)] = {d for d in named if d in known and d != (module, qualname)}
    return graph


@cache
def reached_defs(start: Def) -> set[Def]:
    """``start`` and every def its code names, directly or through others."""
    return closure(start, lambda d: references().get(d, ()))


@cache
def exported() -> dict[str, Def]:
    """``bt.NAME`` -> the def it is, where it is defined."""
    return {name: resolve(("helpers", name)) for name in helpers.__all__}


@cache
def notebook_imports() -> dict[Def, set[str]]:
    """(module, name) a notebook imports from helpers directly (``from backward_twice.cli import main``) -> the
    notebooks (stems) that do."""
    found: dict[Def, set[str]] = {}
    pattern = re.compile(r"^\s*from (helpers|backward_twice)((?:\.\w+)+) import (\w+)", re.MULTILINE)
    command = re.compile(r"""-m[\s"',]+backward_twice\b""")  # `python -m backward_twice`: the command's main
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        for package, module, name in pattern.findall(code):
            found.setdefault(resolve((f"{package}{module}", name)), set()).add(path.stem)
        if command.search(code):
            found.setdefault(("backward_twice.cli", "main"), set()).add(path.stem)
    return found


@cache
def entries() -> dict[Def, set[str]]:
    """Each def a notebook calls by name (``bt.NAME``, or imported from a helpers module) -> the notebooks."""
    found: dict[Def, set[str]] = {d: set(stems) for d, stems in notebook_imports().items()}
    for name, stems in notebook_calls().items():
        if name in helpers.__all__:
            found.setdefault(resolve(("helpers", name)), set()).update(stems)
    return found


@cache
def notebooks_of_def() -> dict[Def, set[str]]:
    """Each def -> the notebooks that call it by name; a def no notebook calls by name -> the notebooks that call a
    def whose code reaches it."""
    users: dict[Def, set[str]] = {}
    for entry, stems in entries().items():
        for reached in reached_defs(entry):
            users.setdefault(reached, set()).update(stems)
    return users | entries()


@cache
def notebooks_of_module(module: str) -> set[str]:
    """The notebooks that call a def defined in ``module``, in a module that imports it (directly or through
    others), or re-exported by a package's ``__init__`` on its way to ``bt``."""
    found = set()
    for (defined_in, name), stems in entries().items():
        through = {m for m in modules() if is_package(m) and m not in PACKAGES and name in bindings(m)}
        if module in reached_modules(defined_in) | through:
            found |= stems
    return found


def code_users_of_def(definition: Def) -> set[Def]:
    """The defs whose code names ``definition``, other than itself and its own class."""
    module, qualname = definition
    own = {qualname, qualname.split(".")[0]}  # the def itself, its class, and the class's methods
    return {
        (user_module, user)
        for (user_module, user), named in references().items()
        if definition in named and not (user_module == module and user.split(".")[0] in own)
    }


SENTENCE = re.compile(r"Used by (?P<body>.*?)\.(?=\s|$)")
NOTEBOOK_LIST = re.compile(r"notebooks? (?P<list>.*)")
CODE_REF = re.compile(r":(?P<role>mod|func|class|meth|data):`(?P<name>[\w.]+)`")
LEARNERS = re.compile(r'learners [^()]+ \(README, "(?P<section>[^"]+)"\)')


def listed(text: str) -> list[str]:
    """``"a"``, ``"a and b"``, ``"a, b and c"`` -> the items; anything else -> []."""
    *head, last = text.split(" and ") if " and " in text else [text]
    items = [*(head[0].split(", ") if head else []), last]
    return items if len(head) <= 1 and all(items) else []


@dataclass
class Claim:
    notebooks: set[str] | None = None  # None: the claim names no notebook
    code: set[tuple[str, str]] | None = None  # (role, name)
    sections: tuple[str, ...] = ()


def parse(doc: str) -> list[Claim]:
    """The claims in a docstring; AssertionError naming the words that are not in the grammar."""
    text = " ".join(doc.split())
    sentences = list(SENTENCE.finditer(text))
    starts = {m.start() for m in sentences}
    for mention in re.finditer(r"\bused by\b", text, re.IGNORECASE):
        assert mention.start() in starts, (
            f"'used by' outside a 'Used by ...' sentence: ...{text[max(0, mention.start() - 30) :][:90]}..."
        )
    claims = []
    for sentence in sentences:
        claim = Claim()
        for group in sentence["body"].split(", and by "):
            if notebooks := NOTEBOOK_LIST.fullmatch(group):
                stems = listed(notebooks["list"])
                plural = group.startswith("notebooks ")
                assert stems and len(stems) == len(set(stems)) and plural == (len(stems) > 1), (
                    f"not a list of notebooks: {group!r}"
                )
                claim.notebooks = (claim.notebooks or set()) | set(stems)
            elif (refs := listed(group)) and all(CODE_REF.fullmatch(r) for r in refs):
                claim.code = (claim.code or set()) | {
                    (m["role"], m["name"]) for m in map(CODE_REF.fullmatch, refs) if m
                }
            elif learners := LEARNERS.fullmatch(group):
                claim.sections += (learners["section"],)
            else:
                raise AssertionError(
                    f"{group!r} in {sentence[0]!r} is not a list of notebooks, of :mod:/:func:/:class:/:meth:/:data:"
                    ' references, or learners ... (README, "SECTION")'
                )
        claims.append(claim)
    return claims


@dataclass(frozen=True)
class Docstring:
    module: str
    qualname: str  # "" for the module's own docstring; "<nested> f" for a def inside a function
    text: str

    def __str__(self) -> str:
        return f"{self.module}.{self.qualname}" if self.qualname else self.module


CLAIMS = re.compile(r"\bused by\b|\bonly notebook \w+ uses\b", re.IGNORECASE)
ONLY_NOTEBOOK = re.compile(r"\bonly notebook (?P<stem>\w+) uses\b", re.IGNORECASE)


def docstrings() -> list[Docstring]:
    """Every docstring in helpers that says "used by", or what only one notebook uses."""
    found = []
    for module, tree in modules().items():
        qualnames = {id(node): qualname for qualname, node in defs(module)}
        owners = [(tree, "")] + [
            (node, qualnames.get(id(node), f"<nested> {node.name}"))
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ]
        for node, qualname in owners:
            text = ast.get_docstring(node)
            if text and CLAIMS.search(" ".join(text.split())):
                found.append(Docstring(module, qualname, text))
    return found


def role(definition: Def) -> str:
    module, qualname = definition
    if "." in qualname:
        return "meth"
    node = dict(defs(module))[qualname]
    return {ast.ClassDef: "class", ast.FunctionDef: "func", ast.AsyncFunctionDef: "func"}.get(type(node), "data")


def code_users(docstring: Docstring, claimed: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The code users of a docstring's module or def, named as the claim names them: a method counts as its class
    unless the claim names the method."""
    if not docstring.qualname:
        return {("mod", m) for m in importers(docstring.module)}
    named = set()
    for user in code_users_of_def((docstring.module, docstring.qualname)):
        as_method = (role(user), user[1])
        named.add(as_method if as_method in claimed or "." not in user[1] else ("class", user[1].split(".")[0]))
    return named


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README.read_text(encoding="utf-8"), re.M | re.S)
    assert match, f'README has no section "{title}"'
    return match[1]


def names_for_learners(docstring: Docstring) -> set[str]:
    """Patterns for what a README section may call the module or def: its name as a word, or a console script that
    runs the module, as a command (``backward-twice watch``, not the repository's folder ``cd backward-twice``)."""
    name = (docstring.qualname or docstring.module).split(".")[-1]
    table = re.search(r"^\[project\.scripts\]\n(.*?)(?=^\[|\Z)", PYPROJECT.read_text(encoding="utf-8"), re.M | re.S)
    scripts = dict(re.findall(r'^([\w-]+) = "([\w.:]+)"', table[1] if table else "", re.M))
    commands = {c for c, target in scripts.items() if target.split(":")[0].split(".")[-1] == name}
    return {rf"(?<![\w-]){re.escape(name)}\b"} | (
        set() if docstring.qualname else {rf"(?<![\w/-]){re.escape(c)} [a-z]" for c in commands}
    )


def derived_notebooks(docstring: Docstring) -> set[str]:
    if docstring.qualname:
        return notebooks_of_def().get((docstring.module, docstring.qualname), set())
    return notebooks_of_module(docstring.module)


@pytest.mark.parametrize("docstring", docstrings(), ids=str)
def test_every_used_by_sentence_names_exactly_the_derived_users(docstring: Docstring) -> None:
    assert not docstring.qualname.startswith("<nested>"), f"{docstring}: a nested def's users are not derived"
    derived = derived_notebooks(docstring)
    for only in ONLY_NOTEBOOK.finditer(" ".join(docstring.text.split())):
        assert derived == {only["stem"]}, (
            f"{docstring} says only {only['stem']} uses it; the notebooks give {sorted(derived)}"
        )
    for claim in parse(docstring.text):
        if claim.notebooks is not None:
            assert claim.notebooks == derived, (
                f"{docstring} says used by notebooks {sorted(claim.notebooks)}; the notebooks give {sorted(derived)}"
            )
        if claim.code is not None:
            derived_code = code_users(docstring, claim.code)
            assert claim.code == derived_code, (
                f"{docstring} says used by {sorted(claim.code)}; the code gives {sorted(derived_code)}"
            )
        for title in claim.sections:
            text = section(title)
            patterns = names_for_learners(docstring)
            assert any(re.search(p, text) for p in patterns), f'README\'s "{title}" matches none of {sorted(patterns)}'


def used_by(obj: object) -> set[str]:
    """The notebooks an exported name's docstring says use it."""
    doc = inspect.getdoc(obj) or ""
    claimed = [c.notebooks for c in parse(doc) if c.notebooks is not None]
    assert claimed, f"{getattr(obj, '__qualname__', obj)}'s docstring has no 'Used by notebook ...' sentence"
    return set().union(*claimed)


@pytest.mark.parametrize("name", helpers.__all__)
def test_each_public_helper_says_exactly_which_notebooks_use_it(name: str) -> None:
    assert used_by(getattr(helpers, name)) == notebook_calls()[name]
