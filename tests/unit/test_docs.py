"""The README stays short and every relative link of the README and the guides in docs/ resolves.

A link resolves when its file (or folder) exists, relative to the page, and its anchor, if any, is
a heading of the target page as GitHub turns headings into anchors. No TensorFlow here.
"""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
MAX_README_LINES = 260

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def prose(text: str) -> str:
    """The page without its fenced code blocks (a `# comment` in a shell block is no heading)."""
    return FENCE.sub("", text)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    for title in HEADING.findall(prose(page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def broken_links(page: Path) -> list[str]:
    """Every relative link of ``page`` whose file or anchor does not exist, as ``target: why``."""
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not a file of the repository
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file {linked}")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            broken.append(f"{target}: no heading of {linked.name} makes the anchor #{anchor}")
    return broken


def test_the_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines, at most {MAX_README_LINES}: move the detail into a guide in docs/")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_guides_are_linked_from_the_readme():
    linked = set(LINK.findall(prose(README.read_text())))
    for guide in ("running", "clusters", "fault-tolerance", "fit", "benchmarks", "architecture"):
        assert f"docs/{guide}.md" in linked, f"README.md links no docs/{guide}.md"


def test_a_broken_file_or_anchor_is_found(tmp_path):
    (tmp_path / "guide.md").write_text("# Guide\n\n## Two words: `code`\n\n```bash\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](guide.md#two-words-code) [file](missing.md) [anchor](guide.md#not-a-heading) "
                    "[web](https://example.com/x.md)\n```\n[in code](nowhere.md)\n```\n")
    assert broken_links(page) == [
        f"missing.md: no such file {tmp_path / 'missing.md'}",
        "guide.md#not-a-heading: no heading of guide.md makes the anchor #not-a-heading",
    ]


def test_ci_reads_the_test_command_after_the_marker():
    """`.ci/run` takes the README's test command with awk, the second line after the marker."""
    awk = re.search(r"awk '([^']+)' README\.md", (REPO / ".ci" / "run").read_text())
    assert awk, ".ci/run no longer reads the test command from README.md with awk"
    command = subprocess.run(["awk", awk.group(1), "README.md"], cwd=REPO, capture_output=True, text=True,
                             check=True, timeout=30).stdout.strip()
    assert command == 'pip install -e ".[test]" && python -m pytest'
    assert "```bash\npip install -e . && python -m tfdist.train --strategy mirrored\n```" in README.read_text()


def test_the_feature_tests_record_parameter_server_for_every_feature():
    # docs/fit-features.json is written by the feature tests (TFDIST_UPDATE_MATRIX=1), which compare against it;
    # the synchronous modes are the check's fixed sample's (tests/cluster/test_check.py).
    import json

    from helpers.feature_matrix import MATRIX

    matrix = json.loads(MATRIX.read_text())
    assert matrix and all(set(row) == {"parameter_server"} for row in matrix.values()), matrix


def test_the_architecture_lists_the_fixes_of_keras_own_fit_as_the_code_does():
    """docs/architecture.md's table of Keras' own fit fixes is ``FIXES``, in order, each row saying what its
    module has: an ``install()`` and/or an ``around`` of one fit."""
    from tfdist.keras_fit.fixes import FIXES

    page = (REPO / "docs" / "architecture.md").read_text()
    table = page.split("<!-- fixes -->")[1].split("<!-- /fixes -->")[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in table.strip().splitlines()[2:]]
    documented = [(name.strip("`"), bool(install), bool(around)) for name, install, around in rows]
    in_code = [(fix.__name__.removeprefix("tfdist.keras_fit."),
                hasattr(fix, "install"), hasattr(fix, "around")) for fix in FIXES]
    assert documented == in_code
