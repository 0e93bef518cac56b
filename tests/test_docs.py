"""The documentation: README.md stays short and keeps its two commands, and every relative link
in README.md and docs/ points to a file that exists (and, into a markdown file, to a heading)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to dashes, repeats numbered."""
    seen: dict[str, int] = {}
    for line in FENCE.sub("", path.read_text()).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def _links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text()))


def test_every_relative_link_resolves() -> None:
    broken = []
    for doc in DOCS:
        for target in _links(doc):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            where = f"{doc.relative_to(ROOT)}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{where} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_is_short_and_keeps_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "./scripts/demo.sh      # the demo:" in readme
    assert "./scripts/test.sh      # the test suite" in readme


def test_the_nodeslo_table_in_architecture_md_is_the_codes() -> None:
    from koordnode.kube.nodeslo import nodeslo_table

    text = (ROOT / "docs" / "architecture.md").read_text()
    start, end = "<!-- nodeslo-table: generated -->\n", "<!-- nodeslo-table: end -->"
    assert start in text and end in text
    documented = text.split(start, 1)[1].split(end, 1)[0]
    assert documented == nodeslo_table(), (
        "docs/architecture.md's NodeSLO table is stale: replace it with the output of python3 -c "
        "'from koordnode.kube.nodeslo import nodeslo_table; print(nodeslo_table(), end=\"\")'")
