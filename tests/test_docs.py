"""The documentation is checked like code: every site code has a page that `regionalize rule` prints and
whose example is what the tool really does; every relative link resolves; every command of the README's
quick start is run here, or shown as illustrative.

Set REGIONALIZE_UPDATE_FIXTURES=1 to rewrite the code pages' example output and the index in
docs/codes.md from what the tool does now, then review them with `git diff`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import docs_examples
import pytest
import tomllib
from click.testing import CliRunner

from regionalize.cli import main
from regionalize.cli.report import to_json, to_sarif
from regionalize.shared import rules
from regionalize.shared.sites import CODES, FileReport, Site

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "regionalize" / "codes"
UPDATE = os.environ.get("REGIONALIZE_UPDATE_FIXTURES") == "1"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted(PAGES.glob("*.md"))]


# -- every code has a page ----------------------------------------------------------------------------


def emitted_codes() -> set[str]:
    """Every code string the package's source can emit, so a new code without a page fails here."""
    found: set[str] = set()
    for source in (ROOT / "regionalize").rglob("*.py"):
        found |= set(re.findall(r"[\"'](RGZ\d{3})[\"']", source.read_text(encoding="utf-8")))
    return found


def test_every_code_the_tool_can_emit_has_a_page() -> None:
    codes = emitted_codes()
    assert {"RGZ001", "RGZ108", "RGZ201", "RGZ900"} <= codes  # the search itself works
    missing = sorted(codes - set(rules.pages()))
    assert not missing, f"no page regionalize/codes/<code>.md for {missing}"
    assert set(CODES) == set(rules.pages())


@pytest.mark.parametrize("code", sorted(rules.pages()))
def test_page_has_its_title_and_sections(code: str) -> None:
    text = rules.page(code)
    assert rules.title(code, text) == CODES[code]
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert headings == ["Why", "Example", "What you can do"], f"{code}.md sections: {headings}"


def test_a_page_without_its_title_is_refused() -> None:
    with pytest.raises(ValueError, match="must start with"):
        rules.title("RGZ108", "# RGZ109: the wrong code\n")
    with pytest.raises(ValueError, match="must start with"):
        rules.title("RGZ108", "RGZ108 has no title\n")


# -- regionalize rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(rules.pages()))
def test_rule_prints_the_page(code: str) -> None:
    status, out, err = invoke("rule", code)
    assert status == 0, err
    assert out.splitlines()[0] == f"# {code}: {CODES[code]}"
    assert out == rules.page(code)


def test_rule_takes_any_case() -> None:
    assert invoke("rule", "rgz108")[1] == rules.page("RGZ108")


def test_rule_all_prints_every_page() -> None:
    status, out, _ = invoke("rule", "--all")
    assert status == 0
    titles = [line.split(":")[0][2:] for line in out.splitlines() if re.match(r"# RGZ\d{3}: ", line)]
    assert titles == sorted(rules.pages())


def test_rule_unknown_code_is_an_error() -> None:
    status, out, err = invoke("rule", "RGZ999")
    assert status == 2 and out == ""
    assert err.startswith("error: unknown code 'RGZ999'") and len(err.splitlines()) == 1


@pytest.mark.parametrize("args", [("rule",), ("rule", "RGZ108", "--all")])
def test_rule_needs_one_code_or_all(args: tuple[str, ...]) -> None:
    status, _, err = invoke(*args)
    assert status == 2 and "give one CODE, or --all" in err


# -- each page's example is what the tool does --------------------------------------------------------


def example_blocks(text: str) -> list[re.Match[str]]:
    start = text.index("\n## Example\n")
    end = text.index("\n## ", start + 1)
    return [m for m in FENCE.finditer(text, start, end) if m[1].split()[:1] in (["python"], ["console"])]


def file_of(block: str) -> str:
    first = block.split("\n", 1)[0]
    assert re.fullmatch(r"# mypkg/\w+\.py", first), f"a file block starts with `# mypkg/NAME.py`: {first!r}"
    return first[2:]


@pytest.mark.parametrize("code", sorted(rules.pages()))
def test_page_example_is_what_the_tool_does(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files before the console block are written, its `$ regionalize ...` line is run in their
    folder, and what it prints, and the files after it, must be as the page shows them."""
    path = PAGES / f"{code}.md"
    text = path.read_text(encoding="utf-8")
    blocks = example_blocks(text)
    consoles = [i for i, m in enumerate(blocks) if m[1].startswith("console")]
    assert len(consoles) == 1, f"{code}.md: its Example has one ```console block"
    console = blocks[consoles[0]]
    inputs, outputs = blocks[: consoles[0]], blocks[consoles[0] + 1 :]
    assert inputs, f"{code}.md: the Example's ```python file comes before its ```console block"
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    for block in inputs:
        (tmp_path / file_of(block[2])).write_text(block[2], encoding="utf-8")
    command, *expected = console[2].splitlines()
    assert command.startswith("$ regionalize "), f"{code}.md: the console block starts with the command"
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, shlex.split(command)[2:], catch_exceptions=False)
    shown = result.output.splitlines()
    written = [(tmp_path / file_of(block[2])).read_text(encoding="utf-8") for block in outputs]
    if UPDATE:
        replacements = [(console, "\n".join([command, *shown]) + "\n")]
        replacements += [(block, new) for block, new in zip(outputs, written, strict=True)]
        for block, body in sorted(replacements, key=lambda r: -r[0].start(2)):
            text = text[: block.start(2)] + body + text[block.end(2) :]
        path.write_text(text, encoding="utf-8")
        expected = shown
        outputs = example_blocks(text)[consoles[0] + 1 :]
    assert shown == expected, f"{code}.md: the output differs (REGIONALIZE_UPDATE_FIXTURES=1 rewrites it)"
    # The example shows its own code; a file that cannot be processed is an `error:` line in text, and
    # RGZ900 only in SARIF.
    assert ("error: " if code == "RGZ900" else f" {code} ") in "\n".join(shown)
    for block, new in zip(outputs, written, strict=True):
        assert new == block[2], f"{code}.md: {file_of(block[2])} differs after the command"


# -- the codes' index, and the reports' links ---------------------------------------------------------

INDEX = ROOT / "docs" / "codes.md"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


BEGIN, END = "<!-- codes: begin (written by tests/test_docs.py) -->\n", "<!-- codes: end -->\n"


def index_table() -> str:
    rows = [f"| [{code}](../{rules.path(code)}) | {cell(meaning)} |" for code, meaning in CODES.items()]
    return "| code | meaning |\n|---|---|\n" + "\n".join(rows) + "\n"


def test_codes_index_lists_every_page() -> None:
    text = INDEX.read_text(encoding="utf-8")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    if UPDATE:
        INDEX.write_text(text[:start] + index_table() + text[end:], encoding="utf-8")
        return
    assert text[start:end] == index_table(), "docs/codes.md (REGIONALIZE_UPDATE_FIXTURES=1 rewrites it)"


def test_codes_page_says_what_each_family_of_codes_does() -> None:
    """The families docs/codes.md names (RGZ0nn rewrites, RGZ1nn skips, RGZ2nn warnings) are what the
    fixtures' site lines show, the exceptions it names included."""
    text = INDEX.read_text(encoding="utf-8")
    families = dict(re.findall(r"^- `RGZ(\d)nn`: (.+)$", text, re.MULTILINE))
    seen = set()
    for sites in (ROOT / "fixtures").rglob("*.sites"):
        seen |= set(
            re.findall(r": (RGZ\d{3}) (skip|warning|compile|move|make)\b", sites.read_text(encoding="utf-8"))
        )
    expected = {"0": "rewrite", "1": "skip", "2": "warn"}
    for code, verb in seen:
        action = {"skip": "skip", "warning": "warn"}.get(verb, "rewrite")
        if action != expected[code[3]]:
            assert code in families[code[3]], f"docs/codes.md: {code} is a {action}, not named as one"
    assert "RGZ002" in families["0"] and ("RGZ002", "skip") in seen


REPORT = [
    FileReport("m.py", [Site(3, 10, "RGZ108", "comprehension", "Stage", "skip", "holds blocks")]),
    FileReport("bad.py", error="cannot parse"),
]


def test_json_sites_name_their_page() -> None:
    site = json.loads(to_json(REPORT))["files"][0]["sites"][0]
    assert site["doc"] == "regionalize/codes/RGZ108.md" and (ROOT / site["doc"]).is_file()


def test_sarif_rules_carry_their_page(monkeypatch: pytest.MonkeyPatch) -> None:
    run = json.loads(to_sarif(REPORT))["runs"][0]
    by_id = {rule["id"]: rule for rule in run["tool"]["driver"]["rules"]}
    assert {result["ruleId"] for result in run["results"]} == {"RGZ108", "RGZ900"}
    assert set(by_id) == set(CODES)
    assert by_id["RGZ108"]["help"] == {"text": rules.page("RGZ108"), "markdown": rules.page("RGZ108")}
    # SARIF requires an absolute helpUri: none until the pages have a public address, then one per rule.
    assert "helpUri" not in by_id["RGZ108"]
    monkeypatch.setattr(rules, "DOCS_URL", "https://example.org/regionalize/codes/")
    rule = {r["id"]: r for r in json.loads(to_sarif(REPORT))["runs"][0]["tool"]["driver"]["rules"]}["RGZ108"]
    assert rule["helpUri"] == "https://example.org/regionalize/codes/RGZ108.md"


def test_pages_ship_in_the_package() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "codes/*.md" in pyproject["tool"]["setuptools"]["package-data"]["regionalize"]


def test_the_summary_names_a_code_to_look_up(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text("import torch.nn as nn\n\nlayers = nn.ModuleList([nn.Linear(4, 4) for _ in range(8)])\n")
    status, out, err = invoke("--check", str(model))
    assert status == 0 and out.count("\n") == 1 and "RGZ102" in out
    assert err.rstrip().endswith("; regionalize rule RGZ102 explains a code")


# -- links --------------------------------------------------------------------------------------------


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+?)#*$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", path.read_text(encoding="utf-8")))
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for link in relative_links(path):
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(link)
    assert not broken, f"{path.relative_to(ROOT)}: broken links {broken}"


def test_no_page_is_over_400_lines() -> None:
    """A page that long mixes topics: a guide is split by topic, a script's results by run."""
    long = {
        str(p.relative_to(ROOT)): n for p in markdown_files() if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long


def test_the_readme_is_a_landing_page() -> None:
    """What it does, the two commands, before and after, what to expect, how to check: the rest is linked.
    (120 lines: the rewrite is shown as the tool prints it, the expected gain as a rendered table of a row
    a family of models and a picture; every row is on docs/benchmarks.md.)"""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 120


def test_link_check_can_fail(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[a](missing.md) [b](#title) [c](#nowhere) `[d](code.md)`\n")
    assert relative_links(page) == ["missing.md", "#title", "#nowhere"]
    assert anchors(page) == {"title"}


# -- the CLI and the pages agree ------------------------------------------------------------------------


def command_flags() -> dict[str, set[str]]:
    """Each command's flags, `rewrite` being what `regionalize PATH...` runs."""
    found = {}
    for name, command in main.commands.items():
        found[name] = {"-h", "--help"}
        for param in command.params:
            found[name] |= set(getattr(param, "opts", [])) | set(getattr(param, "secondary_opts", []))
    found["rewrite"].add("--version")
    return found


def regionalize_commands(text: str) -> list[str]:
    """The `regionalize ...` commands a page shows: in inline code, and on the lines of its code blocks."""
    shown = re.findall(r"`(regionalize [^`\n]*)`", FENCE.sub("", text))
    for block in FENCE.finditer(text):
        shown += [line[2:] if line.startswith("$ ") else line for line in block[2].splitlines()]
    return [line.split(" #")[0] for line in shown if line.startswith("regionalize ")]


def unknown_flags(text: str) -> list[str]:
    flags = command_flags()
    unknown = []
    for line in regionalize_commands(text):
        words = line.split()
        command = words[1] if words[1] in flags and words[1] != "rewrite" else "rewrite"
        unknown += [
            f"{line}: {flag}"
            for flag in re.findall(r"(?<![\w\[])--[a-z][\w-]*", line)
            if flag not in flags[command]
        ]
    return unknown


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_flag_a_page_gives_a_command_exists(path: Path) -> None:
    assert not unknown_flags(path.read_text(encoding="utf-8"))


def test_the_flag_check_can_fail() -> None:
    page = (
        "Run `regionalize mypkg/ --containers X` or\n```text\nregionalize verify m.py --quick --cold\n```\n"
    )
    assert unknown_flags(page) == [
        "regionalize mypkg/ --containers X: --containers",
        "regionalize verify m.py --quick --cold: --cold",
    ]
    assert len(regionalize_commands((ROOT / "README.md").read_text(encoding="utf-8"))) >= 5


# -- the README's commands ------------------------------------------------------------------------------
# Convention (docs/design.md): a ```sh block holds commands that a test below runs or checks; a ```console
# block holds `$ command` lines, each run by a test and followed by what it prints (tests/docs_examples.py);
# a command that is only shown, not run, goes in a ```text block.

README = ROOT / "README.md"


def section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    return text[start : text.index("\n## ", start + 1)]


def rgz001_example(folder: Path) -> None:
    """RGZ001's page's example files, which its own test runs, written under `folder`."""
    (folder / "mypkg").mkdir()
    (folder / "mypkg" / "__init__.py").write_text("")
    for block in example_blocks(rules.page("RGZ001")):
        if block[1].startswith("python") and block[2].startswith("# mypkg/"):
            (folder / file_of(block[2])).write_text(block[2], encoding="utf-8")
            break


@pytest.mark.parametrize(("title", "where"), [("Quick start", "root"), ("Before and after", "rgz001")])
def test_readme_console_prints_what_it_shows(title: str, where: str, tmp_path: Path) -> None:
    """The README's ```console commands, run: the fixtures in the repository, the rewrite on RGZ001's
    example. REGIONALIZE_UPDATE_FIXTURES=1 writes what they print (where the block elides nothing)."""
    folder = ROOT if where == "root" else tmp_path
    if where == "rgz001":
        rgz001_example(tmp_path)
    commands = docs_examples.commands(section(title))
    assert commands, f"README's {title} runs a command"
    outputs = [(command, docs_examples.run(command.line, folder)) for command in commands]
    if UPDATE and not any("..." in command.shown for command, _ in outputs):
        text = README.read_text(encoding="utf-8")
        start = text.index(f"\n## {title}\n")
        README.write_text(text[:start] + docs_examples.updated(text[start:], outputs), encoding="utf-8")
        return
    for command, printed in outputs:
        assert docs_examples.matches(command.shown, printed), (
            f"README: `{command.line}` printed\n" + "\n".join(printed)
        )


def check_install_and_run() -> None:
    """`pip install .` gives the `regionalize` command (what it prints on the fixtures: the test above)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["scripts"]["regionalize"] == "regionalize.cli:main"
    assert next(c.line for c in docs_examples.commands(section("Quick start"))) == "regionalize fixtures/"


def check_ci_runs_it() -> None:
    """This suite is the test command: CI (.ci/run) installs the same requirements and runs it."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r'pip install (--quiet )?"torch==2\.13\.0" -e "\.\[verify,test\]"', ci)
    assert "python -m pytest" in ci


CHECKED = {
    "pip install . && regionalize fixtures/": check_install_and_run,
    'pip install "torch==2.13.0" -e ".[verify,test]" && python -m pytest': check_ci_runs_it,
}


def test_quick_start_commands_are_checked() -> None:
    commands = docs_examples.shell_commands(section("Quick start"))
    assert sorted(commands) == sorted(CHECKED), (
        "each ```sh command of the README's Quick start is run by a test in tests/test_docs.py; "
        "show one that is not run in a ```text block"
    )


@pytest.mark.parametrize("command", sorted(CHECKED))
def test_quick_start_command(command: str) -> None:
    CHECKED[command]()


def test_readme_names_a_quick_subset_that_exists() -> None:
    """The quick test command the README names runs files that exist."""
    quick = re.search(r"`python -m pytest ((?:tests/\S+\.py ?)+)`", section("Quick start"))
    assert quick, "README names a quick subset of the tests"
    assert all((ROOT / name).is_file() for name in quick[1].split())
