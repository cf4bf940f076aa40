"""docs/architecture.md tells the truth about the code: its module list names every module under nbscale/ and
nothing else, every path it names exists, a run is drawn as resolve, place, train, report, its shared modules
are tests/test_layers.py's, and its interrupt paragraph names every module that sets SIGINT's handler."""

from __future__ import annotations

import re

from tests.kernel_session import REPO_ROOT
from tests.test_layers import SHARED

DOC = REPO_ROOT / "docs" / "architecture.md"
PACKAGE = REPO_ROOT / "nbscale"
# files the page names that a run writes or a user keeps, not files of this repository
NOT_IN_THE_REPOSITORY = {"cell.py", "profiles.toml"}
# where a relative path the page names may start: the repository, the package, the docs, the lab extension
BASES = [REPO_ROOT, PACKAGE, REPO_ROOT / "docs", REPO_ROOT / "labextension"]
FILE_NAME = re.compile(r"^[\w-]+\.(?:py|md|ts|toml|sh)$")


def _text() -> str:
    return DOC.read_text()


def _section(heading: str) -> str:
    """The page's text under `heading` (a "## " heading), up to the next one."""
    text = _text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _listed_modules() -> set[str]:
    """The modules "Every module, one line each" names, as paths under nbscale/ ("pool/session.py")."""
    section = _section("Packages and modules")
    items = section[section.index("Every module, one line each:") :].split("\n- ")[1:]
    listed = set()
    for item in items:
        folder = re.match(r"`?((?:[a-z_]+/)*)", item)
        default = folder.group(1) if folder else ""
        for prefix, name in re.findall(r"((?:[a-z_]+/)*)`(\w+\.py)`", item):
            listed.add((prefix or default) + name)
    return listed


def test_the_module_list_names_every_module_under_nbscale_and_only_those() -> None:
    modules = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")}
    listed = _listed_modules()
    assert not modules - listed, f"modules docs/architecture.md's list does not name: {sorted(modules - listed)}"
    assert not listed - modules, f"modules the list names that do not exist: {sorted(listed - modules)}"


def _named_paths() -> set[str]:
    """Every file or folder the page names: a word with a slash in it, or a file name (`x.py`, `y.md`). Not a
    web address, a template (`training/<n>.jsonl`), an absolute path of the machine (`/dev/shm`), an npm package
    (`@lumino/polling`), a rate (images/s) or a pair of words (text/HTML)."""
    text = re.sub(r"\(http[^)]*\)|\w+://\S*", "", _text())
    named = set()
    for word in re.findall(r"[\w./$<>*@-]*/[\w./$<>*@-]*|[\w-]+\.(?:py|md|ts|toml|sh)\b", text):
        word = word.strip(".,")
        if FILE_NAME.match(word):
            named.add(word)
        elif re.fullmatch(r"[a-z_]+(/[a-z0-9_.-]+)*/?", word) and not word.endswith("/s"):
            named.add(word)
    return named - NOT_IN_THE_REPOSITORY


def _exists(path: str) -> bool:
    if path.count("/") <= int(path.endswith("/")):  # a name alone: a file or folder of that name in the repository
        name = path.rstrip("/")
        places = (PACKAGE, REPO_ROOT / "bench", REPO_ROOT / "docs", REPO_ROOT / "labextension" / "src")
        return (REPO_ROOT / name).exists() or any(any(base.rglob(name)) for base in places)
    return any((base / path).exists() for base in BASES)


def test_every_path_the_page_names_exists() -> None:
    missing = sorted(path for path in _named_paths() if not _exists(path))
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_training_package_is_named_as_it_is() -> None:
    assert (PACKAGE / "training").is_dir() and not (PACKAGE / "train").exists()
    assert not re.search(r"(?<![\w%/.-])train/", _text()), "docs/architecture.md still calls training/ train/"


def test_a_run_is_drawn_as_resolve_place_train_report() -> None:
    drawing = _section("A training run: resolve, place, train, report").split("```")[1]
    steps = [
        re.search(rf"^\s*{n} {step}\b", drawing, re.M)
        for n, step in enumerate(("RESOLVE", "PLACE", "TRAIN", "REPORT"), 1)
    ]
    assert all(steps), "the run's drawing lacks a step"
    assert [step.start() for step in steps if step] == sorted(step.start() for step in steps if step)


def test_the_shared_modules_are_the_layer_tests_shared_modules() -> None:
    line = re.search(r"^Shared \(import none of the above\):(.*?)\n\n", _section("Packages and modules"), re.M | re.S)
    assert line is not None
    assert set(re.findall(r"`(\w+)\.py`", line.group(1))) == SHARED


def test_the_interrupt_paragraph_names_every_module_that_sets_sigints_handler() -> None:
    setting = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"\bsignal\.signal\(\s*signal\.SIGINT", path.read_text())
    }
    paragraph = _text().split("**Who handles the interrupt (SIGINT)**", 1)[1].split("\n\n", 1)[0]
    assert setting, "no module sets SIGINT's handler: the paragraph and this test are out of date"
    assert not {module for module in setting if module not in paragraph}, (setting, paragraph)
