"""The README and docs/ hold together: every relative link and #anchor resolves, the README stays a
front page (under 300 lines, a table of contents, the set-up commands CI runs) and its map of the
code names every module and top-level folder there is (CPU)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, ROOT / "BENCHMARKS.md", *sorted(DOCS.glob("*.md"))]

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code spans blanked."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, re.sub(r"`[^`]*`", "``", line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link's text stays
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a page's headings give, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[tuple[int, str]]:
    return [(number, m.group(1)) for number, line in prose_lines(page.read_text())
            for m in LINK.finditer(line)]


def test_slug_matches_github(tmp_path):
    assert slug("The C ABI") == "the-c-abi"
    assert slug("Tuning: `gemmgen tune`") == "tuning-gemmgen-tune"
    assert slug("sm_80 to sm_90: mma.sync") == "sm_80-to-sm_90-mmasync"
    assert slug("Issue 12's must-holds at 8d5ad6f, and SIMT") == "issue-12s-must-holds-at-8d5ad6f-and-simt"
    page_text = "# A\n## Math\n### math\n```\n# not a heading\n```\n"
    probe = tmp_path / "probe.md"
    probe.write_text(page_text)
    assert anchors(probe) == {"a", "math", "math-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for number, target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where} (no heading gives #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_is_a_front_page_with_a_table_of_contents():
    text = README.read_text()
    assert len(text.splitlines()) < 300, "README.md is a front page: move reference to docs/"
    sections = [slug(m.group(2)) for line in text.splitlines()
                if (m := HEADING.match(line)) and len(m.group(1)) == 2]
    assert "contents" in sections, "README.md needs a '## Contents' section"
    contents = text.split("## Contents", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"\]\(#([^)]+)\)", contents)
    missing = [s for s in sections if s != "contents" and s not in listed]
    assert not missing, f"README's contents do not list these sections: {missing}"
    for name in ("Set up", "A first kernel", "A first library call", "PyTorch", "The numbers",
                 "Where things are"):
        assert slug(name) in sections, f"README.md has no '## {name}' section"


def test_readme_keeps_the_set_up_commands_ci_runs():
    text = README.read_text()
    for line in ("pip install . && gemmgen build specs/warptile.gemm",
                 "pip install '.[test]' && python -m pytest -q"):
        assert f"\n{line}\n" in text, f"README.md's set-up lost the line: {line}"


def test_docs_index_lists_every_page():
    index = (DOCS / "README.md").read_text()
    listed = {m.group(1) for m in re.finditer(r"\]\(([\w.-]+\.md)\)", index)}
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert not pages - listed, f"docs/README.md does not list: {sorted(pages - listed)}"


def test_kernels_page_names_every_shipped_spec():
    page = (DOCS / "kernels.md").read_text()
    missing = [p.name for p in sorted((ROOT / "specs").iterdir()) if f"`{p.name}`" not in page]
    assert not missing, f"docs/kernels.md does not describe: {missing}"


def _tracked_paths() -> list[str]:
    if not (ROOT / ".git").exists() or not shutil.which("git"):
        pytest.skip("not a git checkout: the map is checked against the tracked files")
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_where_things_are_names_every_module_and_folder():
    text = README.read_text()
    table = text.split("## Where things are", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `([^`]+)`", table, re.M))
    tracked = _tracked_paths()
    wanted = set()
    for path in tracked:
        parts = path.split("/")
        if len(parts) > 1:
            wanted.add(parts[0] + "/")                                   # a top-level folder
        if parts[0] == "gemmgen" and len(parts) == 2 and parts[1].endswith((".py", ".lark")):
            wanted.add(path)                                             # a module
        if parts[0] == "gemmgen" and len(parts) > 2:
            wanted.add("/".join(parts[:2]) + "/")                        # a subpackage
    wanted.discard("gemmgen/")
    missing = sorted(wanted - named)
    stale = sorted(n for n in named if n.rstrip("/") not in {p.rstrip("/") for p in wanted})
    assert not missing, f"README's 'Where things are' does not name: {missing}"
    assert not stale, f"README's 'Where things are' names what is not there: {stale}"
