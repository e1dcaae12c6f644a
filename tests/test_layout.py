"""The house plan (docs/development.md, "Layout"): rooms by role, imports that only run down, no import circle.

Every ``import`` of the project's own modules is read from the source (inside functions and under
``TYPE_CHECKING`` too) and checked against the rank of each room below: a module may import its own
room or a room of lower rank, never a higher one.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("grasp_lightning", "tasks", "callbacks")  # folders; tasks/ and callbacks/ are grasp_lightning.tasks/.callbacks
#: grasp_lightning/{tasks,callbacks}/__init__.py: the checkout's loaders of the top-level folders (not in a wheel)
CHECKOUT_LOADERS = (REPO / "grasp_lightning" / "tasks" / "__init__.py", REPO / "grasp_lightning" / "callbacks" / "__init__.py")

#: Rooms, lowest first. A module belongs to the first prefix it starts with (longest prefix wins).
RANKS: dict[str, int] = {
    "grasp_lightning": 0,  # the package root: version only
    "grasp_lightning.errors": 0,
    "grasp_lightning.grpo": 0,  # the GRPO step's parts, by stage (its __init__ imports nothing)
    "grasp_lightning.parsing": 1,
    "grasp_lightning.grpo.objective": 1,  # advantages, ratio, clip, KL and the loss normalisations (torch only)
    "grasp_lightning.monitoring": 1,  # loggers (texts, tables, images to every Lightning logger) and curves
    "grasp_lightning.plugins": 1,  # objects named by import path (rewards of one's own)
    "grasp_lightning.data.records": 1,
    "grasp_lightning.data": 2,  # formats, shards, video, prompts, collate, sampler, windows
    "grasp_lightning.sequence_parallel": 2,  # Ulysses: the decoder's forwards split over a group of ranks
    "grasp_lightning.grpo.config": 2,  # the GRPO task's setting groups
    "grasp_lightning.evaluation": 3,  # evaluation suites, their metrics, protocols and reports
    "grasp_lightning.grpo.rewards": 3,  # the reward terms (GRASP-Bench's scoring reads them too)
    "grasp_lightning.grpo.logprobs": 3,  # chunked log-probs and entropy
    "grasp_lightning.grpo.vision": 3,  # the vision features, computed once per window
    "grasp_lightning.grpo.scoring": 3,  # log-prob forwards over the shared prompt and its completions
    "grasp_lightning.policy": 3,
    "grasp_lightning.quantization": 3,  # QLoRA: bitsandbytes 4-bit loading, dequantization, adapter-only checkpoints
    "grasp_lightning.checkpointing": 3,
    "grasp_lightning.strategies": 3,
    "grasp_lightning.predictions": 3,  # predict's records
    "grasp_lightning.engines": 4,  # rollout engines: decoding, HF generate, the vLLM client (its server imports none of ours)
    "grasp_lightning.task": 4,
    "grasp_lightning.grpo.rollouts": 5,  # rollout records and their selection into micro-batches
    "grasp_lightning.grpo.overlap": 5,  # the next window sampled while this one trains
    "grasp_lightning.grpo.sampling": 5,  # a window's rollouts: generation calls, refill split, the window cache
    "grasp_lightning.datamodule": 5,
    "grasp_lightning.module": 5,
    "grasp_lightning.planning": 6,
    "grasp_lightning.synthetic": 6,
    "grasp_lightning.tasks": 7,  # plugins: import the core, never each other's rooms
    "grasp_lightning.callbacks": 7,
    "grasp_lightning.commands": 8,
    "grasp_lightning.__main__": 9,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in ("tasks", "callbacks"):  # installed under the package (setup.cfg package_dir)
        parts.insert(0, "grasp_lightning")
    return ".".join(parts)


def room(name: str) -> str:
    best = max((p for p in RANKS if name == p or name.startswith(p + ".")), key=len, default=None)
    assert best is not None, f"{name} is in no room of tests/test_layout.py RANKS"
    return best


def own_imports(path: Path, name: str) -> set[str]:
    """Project modules ``path`` imports (absolute and relative; ``from pkg import mod`` counts as
    ``pkg.mod`` when that is a module)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            for a in node.names:
                out.add(f"{mod}.{a.name}")
    return {m for m in out if m.split(".")[0] in PACKAGES}


def graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")
             if "assets" not in p.parts and p not in CHECKOUT_LOADERS]
    names = {module_name(p): p for p in files}
    edges = {}
    for name, path in names.items():
        edges[name] = {m for m in own_imports(path, name) if m in names and m != name}
    return edges


def test_every_module_is_in_a_room_and_imports_run_down() -> None:
    edges = graph()
    wrong = []
    for src, dsts in sorted(edges.items()):
        for dst in sorted(dsts):
            if dst.startswith(src + "."):
                continue  # a package's __init__ re-exports its own modules
            if RANKS[room(dst)] > RANKS[room(src)]:
                wrong.append(f"{src} ({room(src)}) imports {dst} ({room(dst)})")
    assert not wrong, "imports that run back up:\n" + "\n".join(wrong)


def test_no_import_circle() -> None:
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w.startswith(v + ".") or v.startswith(w + "."):
                continue  # a package and its own modules
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_the_core_imports_no_task_callback_command_or_generator() -> None:
    edges = graph()
    core = [m for m in edges if m.startswith("grasp_lightning") and RANKS[room(m)] <= RANKS["grasp_lightning.module"]]
    assert "grasp_lightning.module" in core and "grasp_lightning.data.formats" in core
    bad = sorted((src, dst) for src in core for dst in edges[src]
                 if dst.startswith(("grasp_lightning.tasks", "grasp_lightning.callbacks"))
                 or dst.startswith(("grasp_lightning.commands", "grasp_lightning.synthetic", "grasp_lightning.planning")))
    assert not bad, bad


def test_the_package_imports_no_experiment() -> None:
    """``experiments/`` is research run from a checkout (not installed): no module of the installed packages imports
    it (an installed ``grasp_lightning`` would fail on it)."""
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py") if "assets" not in p.parts]
    bad = sorted(f"{path.relative_to(REPO)} imports {m}" for path in files
                 for m in own_imports_any(path) if m.split(".")[0] == "experiments")
    assert not bad, bad


def own_imports_any(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports (any package)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module)
    return out


def test_lint_holds_what_the_conventions_promise() -> None:
    """``ruff check`` with pyproject.toml's rules: imports sorted, no unused names, a docstring on every
    public module, class, method and function (D1), no function above complexity 12 (C901)."""
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "grasp_lightning", "tasks", "callbacks", "tests",
                           "benchmarks", "experiments"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]



# ------------------------------------------------------------------ the installed package
def setup_cfg():
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return cfg


def test_the_wheel_holds_tasks_callbacks_and_configs_under_grasp_lightning() -> None:
    """setup.cfg lists every package of grasp_lightning/, tasks/ and callbacks/ (no more, no fewer), each
    under ``grasp_lightning`` (the wheel's only top-level name), with tasks/, callbacks/ and configs/
    mapped by ``package_dir``, and the recipes as package data."""
    options = setup_cfg()["options"]
    listed = [line for line in options["packages"].split() if not line.startswith("#")]
    mapping = dict(line.replace(" ", "").split("=") for line in options["package_dir"].splitlines()
                   if "=" in line and not line.lstrip().startswith("#"))
    assert mapping == {"grasp_lightning.tasks": "tasks", "grasp_lightning.callbacks": "callbacks",
                       "grasp_lightning.configs": "configs"}
    found = {module_name(p.parent) for pkg in PACKAGES for p in (REPO / pkg).rglob("__init__.py")
             if "assets" not in p.parts and p not in CHECKOUT_LOADERS}
    assert sorted(listed) == sorted(found | {"grasp_lightning.configs"})
    assert {name.split(".")[0] for name in listed} == {"grasp_lightning"}
    assert "grasp_lightning.configs = *.yaml, */*.yaml" in (REPO / "setup.cfg").read_text()


def test_grasp_lightning_tasks_and_callbacks_are_the_top_level_folders() -> None:
    """In a checkout ``grasp_lightning.tasks`` and ``grasp_lightning.callbacks`` are tasks/ and callbacks/ (the
    checkout loaders), and a config's class path ``grasp_lightning.tasks.grpo.GRPOTask`` is that file's class."""
    from jsonargparse._util import import_object  # what resolves a config's class_path

    import grasp_lightning.callbacks.control.guards as guards
    import grasp_lightning.tasks as tasks_package
    import grasp_lightning.tasks.grpo as grpo

    assert Path(grpo.__file__) == REPO / "tasks" / "grpo.py"
    assert Path(guards.__file__) == REPO / "callbacks" / "control" / "guards.py"
    assert Path(tasks_package.__file__) == REPO / "tasks" / "__init__.py"
    assert sys.modules["grasp_lightning.tasks"] is tasks_package and tasks_package.__doc__.startswith("Task plugins")
    assert import_object("grasp_lightning.tasks.grpo.GRPOTask") is grpo.GRPOTask


def test_no_code_outside_tests_imports_tests_or_the_old_top_level_names() -> None:
    """``git grep "from tests|import tests" -- ':!tests'`` is empty, and no file names ``tasks.X`` or
    ``callbacks.X`` as a module (imports, class paths, docs): they are ``grasp_lightning.tasks.X``."""
    def grep(pattern: str, *paths: str) -> str:
        proc = subprocess.run(["git", "grep", "-nP", pattern, "--", *paths], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode in (0, 1), proc.stderr
        return proc.stdout

    assert grep(r"from tests|import tests", ":!tests") == ""
    old = r"(?<![\w./-])(tasks\.(sft|grpo|grpo_rollouts)\b|callbacks\.(bench|kl_logging|prediction_writer|rollout_samples|" \
          r"step_window|timing|control)\b)|^\s*(from|import) (tasks|callbacks)\b"
    assert grep(old) == ""


def test_unit_test_files_name_a_module() -> None:
    """``tests/unit/<path>/test_<name>.py`` tests the module ``<path>/<name>`` of the package (``tasks/`` and
    ``callbacks/`` are the repository's folders): one test file per module, laid out like the code."""
    unit = REPO / "tests" / "unit"
    files = sorted(unit.rglob("test_*.py"))
    assert len(files) > 20
    orphans = []
    for path in files:
        rel = path.relative_to(unit)
        name = rel.name[len("test_"):-len(".py")]
        base = REPO if rel.parts[0] in ("tasks", "callbacks") else REPO / "grasp_lightning"
        folder = base.joinpath(*rel.parts[:-1])
        if not ((folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file()):
            orphans.append(str(rel))
    assert orphans == [], f"tests/unit files that name no module: {orphans}"


def command_runs(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` of each whole-command run in a parsed test file: a reference to ``run_cli`` (the
    in-process command of :mod:`tests.helpers.cli`), and a command line naming ``-m grasp_lightning...`` (a
    list or tuple literal with ``"-m"`` then ``"grasp_lightning..."``, or one string holding
    ``-m grasp_lightning``) given to a call of ``subprocess`` or ``os``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "run_cli" or isinstance(node, ast.Attribute) and node.attr == "run_cli":
            found.append((node.lineno, "run_cli"))
        elif isinstance(node, ast.ImportFrom) and any(a.name == "run_cli" for a in node.names):
            found.append((node.lineno, "run_cli"))
        elif isinstance(node, (ast.List, ast.Tuple)):
            words = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None for e in node.elts]
            if any(a == "-m" and (b or "").startswith("grasp_lightning") for a, b in zip(words, words[1:])):
                found.append((node.lineno, "-m grasp_lightning"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id in ("subprocess", "os"):
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and "-m grasp_lightning" in arg.value:
                    found.append((node.lineno, "-m grasp_lightning"))
    return sorted(found)


def test_unit_tests_run_no_command() -> None:
    """Whole-command runs live in ``tests/cli/``: no file under ``tests/unit/`` calls ``run_cli`` or runs
    ``python -m grasp_lightning...`` in a subprocess (the unit tests call the module under test)."""
    tree = ast.parse("run = [sys.executable, '-m', 'grasp_lightning', 'fit']\nsubprocess.run('python -m grasp_lightning.x',"
                     " shell=True)\nfrom tests.helpers import run_cli\ncli = run_cli(['fit'], tmp)")
    assert command_runs(tree) == [(1, "-m grasp_lightning"), (2, "-m grasp_lightning"), (3, "run_cli"), (4, "run_cli")]
    runs = [f"{path.relative_to(REPO)}:{line}: {what}" for path in sorted((REPO / "tests" / "unit").rglob("*.py"))
            for line, what in command_runs(ast.parse(path.read_text(), str(path)))]
    assert runs == [], f"whole-command runs under tests/unit/ (move them to tests/cli/): {runs}"


def test_test_modules_import_only_the_helpers() -> None:
    """Shared test code lives in the package ``tests/helpers/`` (a module per concern, none over 400 lines):
    no test module imports another test module or a conftest (fixtures need no import), and the entry scripts
    next to the tests are imported only there; outside the package, tests import its names from
    ``tests.helpers`` itself, never from one of its modules."""
    bad = []
    for path in sorted([*(REPO / "tests").rglob("*.py"), *(REPO / "experiments").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                last = name.rsplit(".", 1)[-1]
                inside = path.parent == REPO / "tests" / "helpers" and name.startswith("tests.helpers.")
                if last.startswith("test_") or last == "conftest" or (name.startswith("tests.") and name != "tests.helpers"
                                                                      and not inside):
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}")
    assert bad == []
    long = {p.name: n for p in (REPO / "tests" / "helpers").glob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}, f"tests/helpers/ modules over 400 lines: {long}"


# ------------------------------------------------------------------ the README and the docs
#: The outline every page of docs/ follows: its level-2 headings, exactly these, in this order.
DOC_OUTLINE = ["Overview", "Quick start", "Looking deeper", "Logged metrics and outputs", "Customization", "Reference"]
#: The pages whose relative links must resolve.
LINKED_PAGES = ["README.md", "benchmarks/results/README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (a repeated heading's ``-1``, ``-2`` too)."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path.read_text(encoding="utf-8")):
        if m := re.match(r"#{1,6} (.+)", line):
            base = slug(m.group(1))
            out.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    return out


def test_readme_is_a_front_door() -> None:
    """README.md: at most 320 lines, no commit hash, the test command .ci/run runs, and a link to every docs page."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 320, f"README.md has {len(text.splitlines())} lines: move text to docs/"
    assert not COMMIT_HASH.findall(text), f"commit hashes in README.md: {COMMIT_HASH.findall(text)}"
    assert "python -m pytest -q" in text and "python -m pytest -q" in (REPO / ".ci" / "run").read_text()
    missing = [p for p in LINKED_PAGES if p.startswith("docs/") and f"]({p})" not in text]
    assert not missing, f"README.md links no docs page {missing}"


@pytest.mark.parametrize("page", sorted(p.name for p in (REPO / "docs").glob("*.md")))
def test_every_docs_page_follows_the_outline(page: str) -> None:
    lines = prose((REPO / "docs" / page).read_text(encoding="utf-8"))
    assert lines[0].startswith("# "), f"docs/{page} does not start with a title"
    headings = [line[3:].strip() for line in lines if line.startswith("## ")]
    assert headings == DOC_OUTLINE, f"docs/{page}: level-2 headings {headings}, expected {DOC_OUTLINE}"


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_every_relative_link_resolves(page: str) -> None:
    """Every relative link of the README, the docs and the results page names an existing file, and its
    ``#anchor`` a heading of that file."""
    source = REPO / page
    broken = []
    for line in prose(source.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            file = (source.parent / path).resolve() if path else source
            if not file.exists():
                broken.append(f"{target}: no file {file.relative_to(REPO) if file.is_relative_to(REPO) else file}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{target}: no heading #{anchor} in {file.relative_to(REPO)}")
    assert not broken, f"{page}: " + "; ".join(broken)


def test_the_docs_give_each_group_its_own_category_codes() -> None:
    """Every "<group> categories (X1–X6)" of the docs names that group's codes (GROUPS: gaze T1–T6,
    gesture G1–G6, joint J1–J4); docs/metrics.md had gaze and gesture swapped."""
    from grasp_lightning.data.records import CATEGORIES, GROUPS

    found = []
    for page in LINKED_PAGES:
        text = (REPO / page).read_text(encoding="utf-8")
        for group, first, last in re.findall(r"\b(gaze|gesture|joint) categories \((\w\d)[–-](\w\d)\)", text):
            found.append((page, group))
            assert (first, last) == (GROUPS[group][0], GROUPS[group][-1]), (page, group, first, last)
        for first, last in re.findall(r"one category \(`(\w\d)` … `(\w\d)`\)", text):
            assert (first, last) == (CATEGORIES[0], CATEGORIES[-1]), (page, first, last)
    assert ("docs/metrics.md", "gaze") in found and ("docs/metrics.md", "gesture") in found
