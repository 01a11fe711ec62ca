"""The README is a user's page and the docs hold the rest: the README stays short, every link
between them resolves (files and headings), and their Python snippets compile (the README's
producer snippet also runs: tests/test_readme_snippets.py)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_the_readme_is_a_user_s_page():
    readme = (REPO / "README.md").read_text()
    size = len(readme.encode())
    assert size < 25_000, f"README.md is {size} bytes; engineering notes go to docs/"
    for section in ("Set up and run", "Using the producer library", "The command line", "Where to read more"):
        assert f"\n## {section}" in readme, section


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_every_relative_link_resolves(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: link to {target!r}: {resolved} does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{page.name}: link to {target!r}: no such heading"


#: a section reference: "§2", "§3.1"
SECTION = re.compile(r"§\s*(\d+(?:\.\d+)*)")
CONTRACT = REPO / "docs" / "contract.md"


def _sections(page: Path) -> set[str]:
    """The section numbers of a page's headings ("## 3.1 By weight version" -> "3.1")."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return set(re.findall(r"^#{1,6} (\d+(?:\.\d+)*)\.? ", text, flags=re.M))


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_section_references_in_links_are_sections_of_the_linked_page(page):
    """ "[contract §2.1](docs/contract.md)" must name a section that page has (issue 33:
    the README pointed at §2.1 and §2.2 of a contract numbered 2 and 1.1)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for label, target in re.findall(r"\[([^\]]*§[^\]]*)\]\(([^)\s]+)\)", text):
        path = target.partition("#")[0]
        linked = (page.parent / path).resolve() if path else page
        have = _sections(linked)
        for number in SECTION.findall(label):
            assert number in have, f"{page.name}: [{label}]({target}): {linked.name} has sections {sorted(have)}"


def test_section_references_to_the_contract_are_its_sections():
    """What code, tests and docs cite as "docs/contract.md §N", and the contract's own
    "(§N)", are sections the contract has."""
    have = _sections(CONTRACT)
    cited = re.compile(r"contract\.md\)?\s*§\s*(\d+(?:\.\d+)*)")
    sources = [
        p
        for folder in ("streams", "producers", "schemas", "tests", "docs", "bench", "examples", "deploy")
        for p in sorted((REPO / folder).rglob("*"))
        if p.suffix in (".py", ".md", ".rs", ".pyi", ".yml", ".yaml") and "target" not in p.parts
    ]
    wrong = [
        f"{p.relative_to(REPO)}: §{number}"
        for p in [REPO / "README.md", *sources]
        for number in cited.findall(p.read_text(errors="replace"))
        if number not in have
    ]
    wrong += [f"contract.md: §{n}" for n in SECTION.findall(CONTRACT.read_text()) if n not in have]
    assert not wrong, f"sections the contract does not have (it has {sorted(have)}): {wrong}"


def _section(page: Path, heading: str) -> str:
    text = page.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


@pytest.mark.parametrize(
    ("page", "heading"),
    [(REPO / "README.md", "## Using the producer library"), (CONTRACT, "## 2. From SGLang")],
)
def test_the_producer_pages_say_the_request_id_or_generation_id_is_required(page, heading):
    """Issue 33: the README's snippet raised on a meta_info without SGLang's request id,
    and neither page said that one of the two is needed."""
    section = _section(page, heading)
    assert 'meta_info["id"]' in section and "generation_id=" in section, heading
    assert re.search(r"required|needs", section) and "ValueError" in section, heading


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_python_snippets_compile(page):
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)):
        # snippets may await at top level (they run inside a rollout worker's coroutine)
        compile(f"async def _snippet():\n{textwrap.indent(block, '    ')}", f"{page.name} block {i}", "exec")


def test_every_doc_is_reachable_from_the_readme():
    readme = (REPO / "README.md").read_text()
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in readme, f"docs/{page.name} is not linked from README.md"
