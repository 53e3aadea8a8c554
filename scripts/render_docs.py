"""Write the parts of the documentation that are generated, so that they cannot drift from their source.

- README.md's "What to expect" (a row a family of models), docs/benchmarks.md's full table, and
  form-caches.md's account of the generation benchmark: from the results files in docs/results
  (scripts/docs_figures.py);
- docs/results/restart.svg, the picture of seconds to the first call against depth: drawn whole, in plain
  SVG, from docs/results/restart.json, which it only reads (scripts/docs_figures.py);
- docs/configuration.md's reference: from the options' definitions (scripts/docs_configuration.py);
- docs/torch-workarounds.md's table: from the runtime's list (scripts/docs_workarounds.py);
- each page's first use of a glossary term, linked (scripts/docs_glossary.py).

The figures a guide quotes inside its prose are not written here but checked: scripts/docs_quotes.py
computes each quote from its results file, and this reports a quote a page no longer says, or a figure
a page's prose gives without a source, which a person rewrites.

Each generated block sits between `<!-- NAME: begin ... -->` and `<!-- NAME: end -->` (the picture is
generated whole); the tests compare the pages with what this writes. Run it after a benchmark writes a
results file or an option changes, and review the change with `git diff`. `--check` writes nothing and
exits 1 where a page or the picture differs.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

# This checkout's scripts and package, whatever else is installed: the pages describe this source.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import docs_configuration
import docs_figures
import docs_glossary
import docs_quotes
import docs_workarounds

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
CACHES = ROOT / "docs" / "form-caches.md"
CUDA_GRAPHS = ROOT / "docs" / "form-cuda-graphs.md"
WORKAROUNDS = ROOT / "docs" / "torch-workarounds.md"


def block(text: str, name: str) -> re.Match[str]:
    """The body between a page's `<!-- NAME: begin ... -->` line and its `<!-- NAME: end -->` line."""
    match = re.search(rf"^<!-- {name}: begin[^\n]*-->\n(.*?)^<!-- {name}: end -->", text, re.M | re.S)
    if match is None:
        raise ValueError(f"no <!-- {name}: begin/end --> markers")
    return match


def with_block(text: str, name: str, body: str) -> str:
    found = block(text, name)
    return text[: found.start(1)] + body + text[found.end(1) :]


# page -> what it should be, given what it is
Renderer = Callable[[str], str]


def renderers() -> dict[Path, list[Renderer]]:
    pages: dict[Path, list[Renderer]] = {page: [] for page in docs_glossary.PAGES}
    pages[README].insert(0, lambda text: with_block(text, "figures", docs_figures.what_to_expect()))
    pages[BENCHMARKS].insert(0, lambda text: with_block(text, "figures", docs_figures.benchmarks()))
    pages[CACHES].insert(0, lambda text: with_block(text, "decode-figures", docs_figures.decode_section()))
    pages[CUDA_GRAPHS].insert(
        0, lambda text: with_block(text, "serving-figures", docs_figures.serving_section())
    )
    pages[CONFIGURATION].insert(
        0, lambda text: with_block(text, "configuration", docs_configuration.reference())
    )
    pages[WORKAROUNDS].insert(0, lambda text: with_block(text, "workarounds", docs_workarounds.table()))
    for page in docs_glossary.PAGES:
        pages[page].append(
            lambda text, page=page: docs_glossary.link_first_uses(text, docs_glossary.href(page))
        )
    pages[docs_figures.PICTURE] = [lambda text: docs_figures.restart_svg()]
    return pages


def current(page: Path) -> str:
    """The page as it is on disk; "" where it is not yet written (a generated file)."""
    return page.read_text(encoding="utf-8") if page.exists() else ""


def rendered(page: Path) -> str:
    text = current(page)
    for render in renderers()[page]:
        text = render(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where a page differs")
    args = parser.parse_args()
    stale = []
    for page in renderers():
        new = rendered(page)
        if new != current(page):
            stale.append(page.relative_to(ROOT))
            if not args.check:
                page.write_text(new, encoding="utf-8")
    for page in stale:
        print(f"{'differs' if args.check else 'written'}: {page}")
    quoted = docs_quotes.problems()
    for problem in quoted:
        print(f"quote: {problem}")
    return 1 if (stale and args.check) or quoted else 0


if __name__ == "__main__":
    raise SystemExit(main())
