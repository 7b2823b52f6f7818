"""The documentation says what the code does: README.md and docs/*.md checked against the code.

- README.md stays short (at most 10,240 bytes);
- every `tag ...` command line in their code (fenced blocks and inline spans) names a real
  subcommand, nested subcommand and flags, read from `tag_core.cli.build_parser()`;
- docs/dagster.md's tables of assets, asset checks, sensors and schedules equal the loaded
  `tag_pipelines.definitions.defs` (keys, partitions, groups, upstream assets, config fields);
- docs/cli.md's generated `--help` blocks are current (docs/generate_cli.py);
- every relative link and image points at a file that exists (and a heading, for `#anchors`),
  and every repository path or `tag_core` module named in code exists.

No TensorFlow: the parser and the Dagster definitions load without it (checked).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_LIMIT = 10_240


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@lru_cache(maxsize=1)
def parser() -> argparse.ArgumentParser:
    from tag_core.cli import build_parser

    return build_parser()


# ---- reading markdown -----------------------------------------------------------------------------

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE = re.compile(r"(`+)(.+?)\1")


def split_markdown(text: str) -> tuple[list[str], list[str]]:
    """(code lines, prose lines): lines of fenced blocks, and the other lines with inline code kept.
    Backslash-continued code lines are joined."""
    code, prose, fenced = [], [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            if code and code[-1].endswith("\\"):
                code[-1] = code[-1][:-1] + " " + line.strip()
            else:
                code.append(line)
        else:
            prose.append(line)
    return code, prose


def code_snippets(text: str) -> list[str]:
    """Every fenced code line and every inline code span, shell comments dropped from fenced lines."""
    code, prose = split_markdown(text)
    snippets = [re.sub(r"(^|\s)#\s.*$", "", line) for line in code]
    for line in prose:
        snippets += [m.group(2).strip() for m in INLINE.finditer(line)]
    return snippets


def prose_without_code(text: str) -> list[str]:
    return [INLINE.sub("", line) for line in split_markdown(text)[1]]


# ---- `tag ...` command lines ----------------------------------------------------------------------

WORD = re.compile(r"^[a-z][a-z0-9-]*(\|[a-z][a-z0-9-]*)*$")
LONG_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][\w-]*)")
SHORT_FLAG = re.compile(r"(?<![\w-])(-[A-Za-z])(?![\w-])")
SEGMENT_END = {"|", "||", "&&", ";", "&"}


def subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def takes_value(p: argparse.ArgumentParser, flag: str) -> bool:
    action = p._option_string_actions.get(flag)
    return action is not None and action.nargs != 0


def check_invocation(tokens: list[str], where: str) -> list[str]:
    """Problems with one `tag` command line (the tokens after `tag`, up to the end of its segment)."""
    problems = []
    current: list[tuple[str, argparse.ArgumentParser]] = [("tag", parser())]
    skip_value = settled = False
    for token in tokens:
        if token in SEGMENT_END:
            break
        flags = LONG_FLAG.findall(token) + SHORT_FLAG.findall(token)
        if flags:
            for flag in flags:
                name = flag.split("=")[0]
                unknown = [label for label, p in current if name not in p._option_string_actions]
                if unknown:
                    problems.append(f"{where}: `{' / '.join(unknown)}` has no option {name}")
            skip_value = len(current) == 1 and subcommands(current[0][1]) and takes_value(current[0][1], flags[-1])
            continue
        if skip_value:  # a global option's value, e.g. `tag --db FILE plan`
            skip_value = False
            continue
        if len(current) == 1 and subcommands(current[0][1]) and not settled:
            if not WORD.match(token):  # a placeholder (`{capture,...}`, `SUBCOMMAND`) or prose: no subcommand named
                settled = True
                continue
            label, p = current[0]
            choices = subcommands(p)
            names = token.split("|")
            missing = [n for n in names if n not in choices]
            if missing:
                problems.append(f"{where}: `{label}` has no subcommand {', '.join(missing)} "
                                f"(known: {', '.join(choices)})")
                break
            current = [(f"{label} {n}", choices[n]) for n in names]
    return problems


def tag_invocations(snippet: str) -> list[list[str]]:
    """The tokens after each `tag` (or `.venv/bin/tag`) that starts a command in `snippet`."""
    tokens = snippet.replace("`", " ").split()
    found = []
    for i, token in enumerate(tokens):
        program = token.lstrip("$(")
        if (program == "tag" or program.endswith("/bin/tag")) and i + 1 < len(tokens):
            found.append(tokens[i + 1:])
    return found


def command_problems(text: str, where: str) -> list[str]:
    problems = []
    for snippet in code_snippets(text):
        for tokens in tag_invocations(snippet):
            problems += check_invocation(tokens, f"{where}: `{snippet[:70]}`")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_tag_commands_and_flags_exist(doc):
    assert command_problems(doc.read_text(), rel(doc)) == []


def test_docs_name_tag_commands():
    # The checker sees something: the docs do show command lines.
    count = sum(len(tag_invocations(s)) for doc in DOCS for s in code_snippets(doc.read_text()))
    assert count > 50


def test_command_checker_catches_made_up_commands_and_flags():
    good = """Run `tag plan mlp --topology t.json --budget-iterations 5 --no-sfb` and then:

```bash
.venv/bin/tag --db x.duckdb topology validate t.json --json   # a comment may say --anything
tag profiles import|export|list
tag emit mlp --plan p.json --fusion && tag run out --check --timeout 60
```
"""
    assert command_problems(good, "good") == []
    bad = """`tag plan mlp --topology t.json --made-up-flag`, `tag frobnicate mlp`,
`tag topology validat FILE`, `tag profiles import --model x`, `tag --nope models`,
`tag run DIR -z`, `tag SUBCOMMAND --nope2`

```bash
.venv/bin/tag simulate mlp --topology t.json --strategy dp-nccl --timelines x.png
tag plan mlp --topology t.json | tag report --outdir x
```
"""
    problems = command_problems(bad, "bad")
    for expected in ["`tag plan` has no option --made-up-flag", "`tag` has no subcommand frobnicate",
                     "`tag topology` has no subcommand validat", "`tag profiles import` has no option --model",
                     "`tag` has no option --nope", "`tag run` has no option -z",
                     "`tag simulate` has no option --timelines", "`tag report` has no option --outdir",
                     "`tag` has no option --nope2"]:
        assert any(expected in p for p in problems), (expected, problems)
    assert len(problems) == 9, problems


def test_parser_does_not_import_tensorflow():
    code = ("import sys; from tag_core.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('tensorflow', 'torch', 'dgl', 'dagster') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---- README size ----------------------------------------------------------------------------------


def test_readme_is_short():
    size = len(README.read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes; move detail into docs/ (limit {README_LIMIT})"


# ---- the generated CLI reference ------------------------------------------------------------------


def load_generator():
    spec = importlib.util.spec_from_file_location("generate_cli", ROOT / "docs" / "generate_cli.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_current():
    generator = load_generator()
    text = (ROOT / "docs" / "cli.md").read_text()
    assert generator.render(text, parser()) == text, "docs/cli.md is stale: run `.venv/bin/python docs/generate_cli.py`"


def test_cli_reference_has_a_section_per_subcommand():
    text = (ROOT / "docs" / "cli.md").read_text()
    headings = set(re.findall(r"^## (tag [a-z-]+)$", text, re.M))
    assert headings == {f"tag {name}" for name in subcommands(parser())}


def test_cli_generator_refuses_missing_and_unknown_blocks():
    generator = load_generator()
    text = (ROOT / "docs" / "cli.md").read_text()
    with pytest.raises(ValueError, match="'tag run' has no generated block"):
        generator.render(text.replace("<!-- generated: tag run -->", "<!-- gone -->"), parser())
    extra = text + "\n<!-- generated: tag frobnicate -->\n<!-- end generated -->\n"
    with pytest.raises(ValueError, match="'tag frobnicate', which is not a command"):
        generator.render(extra, parser())


# ---- Dagster ----------------------------------------------------------------------------------------

DAGSTER_MD = ROOT / "docs" / "dagster.md"


def tables(text: str) -> list[list[dict[str, str]]]:
    """Markdown tables outside code blocks, as lists of {header: cell} rows."""
    found, lines = [], split_markdown(text)[1]
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|$", lines[i + 1]):
            header = [c.strip() for c in lines[i].strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip("|").split("|")]
                rows.append(dict(zip(header, cells)))
                i += 1
            found.append(rows)
        else:
            i += 1
    return found


def table(text: str, first: str) -> list[dict[str, str]]:
    matches = [t for t in tables(text) if t and next(iter(t[0])) == first]
    assert len(matches) == 1, f"docs/dagster.md: want one table whose first column is {first!r}"
    return matches[0]


def spans(cell: str) -> set[str]:
    return {m.group(2) for m in INLINE.finditer(cell)}


@pytest.fixture(scope="module")
def defs():
    from tag_pipelines.definitions import defs

    return defs


def partitions_label(partitions_def) -> str:
    if partitions_def is None:
        return "–"
    dims = getattr(partitions_def, "partitions_defs", None)
    if dims is not None:
        return " × ".join(d.name for d in dims)
    return partitions_def.name


def config_fields(assets_def) -> set[str]:
    schema = assets_def.op.config_schema
    fields = getattr(getattr(schema, "config_type", None), "fields", None)
    return set(fields) if isinstance(fields, dict) else set()


def test_dagster_assets_are_documented_as_they_are(defs):
    graph = defs.resolve_asset_graph()
    rows = {next(iter(spans(row["asset"]))): row for row in table(DAGSTER_MD.read_text(), "asset")}
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert set(rows) - keys == set(), "docs/dagster.md names assets that do not exist"
    assert keys - set(rows) == set(), "assets missing from docs/dagster.md"
    for key in graph.get_all_asset_keys():
        name, node, row = key.to_user_string(), graph.get(key), rows[key.to_user_string()]
        assets_def = node.assets_def
        assert row["partitions"] == partitions_label(node.partitions_def), name
        assert row["group"] == node.group_name, name
        assert spans(row["reads"]) == {k.to_user_string() for k in node.parent_keys}, name
        assert spans(row["config"]) == config_fields(assets_def), name
        assert getattr(assets_def.op, "pool", None) is None, f"{name}: docs/dagster.md says no asset runs in a pool"


def test_dagster_checks_sensors_and_schedules_are_documented(defs):
    text = DAGSTER_MD.read_text()
    checks = {(next(iter(spans(r["check"]))), next(iter(spans(r["asset"])))) for r in table(text, "check")}
    graph = defs.resolve_asset_graph()
    assert checks == {(k.name, k.asset_key.to_user_string()) for k in graph.asset_check_keys}
    listed = {next(iter(spans(r["name"]))): r["kind"] for r in table(text, "name")}
    assert listed == {**{s.name: "sensor" for s in defs.sensors}, **{s.name: "schedule" for s in defs.schedules}}
    for name in defs.resources or {}:
        assert f"`{name}`" in text, f"resource {name!r} is not documented in docs/dagster.md"


def test_dagster_environment_variables_exist():
    sources = "\n".join(p.read_text() for d in ("tag_core", "assets", "sensors", "tag_pipelines")
                        for p in (ROOT / d).rglob("*.py"))
    sources += (ROOT / "Makefile").read_text()
    rows = table(DAGSTER_MD.read_text(), "variable")
    assert rows
    for row in rows:
        (variable,) = spans(row["variable"])
        assert variable in sources, f"docs/dagster.md documents {variable}, which no code reads"


def test_dagster_definitions_load_without_tensorflow():
    code = ("import sys; from tag_pipelines.definitions import defs; defs.resolve_asset_graph(); "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


# ---- links, images, paths and modules ---------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]{1,2}(?=\S)|(?<=\S)[`*_]{1,2}", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The `#anchors` of a markdown text's headings; a repeated heading gets -1, -2, ... as on GitHub."""
    found: set[str] = set()
    for line in split_markdown(text)[1]:
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base, n = slug(m.group(1)), 0
            name = base
            while name in found:
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


def link_problems(text: str, doc: Path) -> list[str]:
    """Broken relative links and images in `text`, read as the file `doc` (which need not exist)."""
    problems = []
    for line in prose_without_code(text):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            path = (doc.parent / path_part).resolve() if path_part else doc
            if path != ROOT and ROOT not in path.parents:
                problems.append(f"{rel(doc)}: {target} leaves the repository")
            elif path_part and not path.exists():
                problems.append(f"{rel(doc)}: {target} does not exist")
            elif anchor and path.suffix == ".md":
                if anchor not in anchors(text if path == doc else path.read_text()):
                    problems.append(f"{rel(doc)}: {target}: no heading #{anchor} in {rel(path)}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_links_and_images_resolve(doc):
    assert link_problems(doc.read_text(), doc) == []


def test_readme_shows_a_picture_from_docs():
    images = [t for line in prose_without_code(README.read_text()) for t in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", line)]
    assert any(t.startswith("docs/") and t.endswith(".png") and (ROOT / t).is_file() for t in images)


def test_link_checker_catches_broken_links():
    text = ("# A heading\n\n[a](no-such-page.md) ![b](images/missing.png) [c](cli.md#no-such-heading) "
            "[d](cli.md#tag-plan) [e](https://x.org/y) [f](#a-heading) [g](#nowhere) [h](../../outside.md)\n"
            "`[i](not-a-link-in-code.md)`\n")
    problems = link_problems(text, ROOT / "docs" / "probe.md")
    assert len(problems) == 5, problems
    for expected in ["no-such-page.md does not exist", "images/missing.png does not exist",
                     "no heading #no-such-heading", "no heading #nowhere", "outside.md leaves the repository"]:
        assert any(expected in p for p in problems), (expected, problems)
    assert slug("The cost model and the simulator") == "the-cost-model-and-the-simulator"
    assert slug("`tag plan`: search") == "tag-plan-search"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


ROOTS = ("tag_core", "assets", "sensors", "tag_pipelines", "tests", "docs", "examples", "data", "benchmarks", "deploy")
STAGES = tuple(p.name for p in (ROOT / "tag_core").iterdir() if (p / "__init__.py").exists())
PATH = re.compile(r"^(?:\.\./)?((?:%s)/[\w./*-]*)$" % "|".join(ROOTS + STAGES))
MODULE = re.compile(r"^(tag_core(?:\.\w+)+)$")


def defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def module_problem(dotted: str) -> str | None:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        source = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if source.exists():
            rest = parts[cut:]
            if rest and rest[0] not in defined_names(source):
                return f"{dotted}: {'.'.join(parts[:cut])} defines no {rest[0]}"
            return None
    return f"{dotted}: no such module"


def path_problems(text: str, where: str) -> list[str]:
    problems = []
    for snippet in code_snippets(text):
        for token in re.split(r"[\s`'\"(),]+", snippet):
            token = token.rstrip(".:;")
            m = PATH.match(token)
            if m and "<" not in token and "{" not in token:
                name = m.group(1)
                base = ROOT if name.split("/")[0] in ROOTS else ROOT / "tag_core"
                if "*" in name:
                    if not list(base.glob(name)):
                        problems.append(f"{where}: {token} matches nothing")
                elif not (base / name).exists():
                    problems.append(f"{where}: {token} does not exist")
            m = MODULE.match(token)
            if m:
                problem = module_problem(m.group(1))
                if problem:
                    problems.append(f"{where}: {problem}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_paths_and_modules_named_in_code_exist(doc):
    assert path_problems(doc.read_text(), rel(doc)) == []


def test_path_checker_catches_stale_paths():
    text = ("`tag_core/cost.py`, `tag_core/simulate/cost.py`, `gnn/compat.py`, `gnn/nothing.py`, "
            "`tag_core.fusion.cost.FusedComputeModel`, `tag_core.fusion_cost.FusedComputeModel`, "
            "`tag_core.fusion.cost.NoSuchThing`, `examples/topologies/*.json`, `examples/none/*.json`")
    problems = path_problems(text, "t")
    assert len(problems) == 5, problems
    for stale in ["tag_core/cost.py", "gnn/nothing.py", "tag_core.fusion_cost", "NoSuchThing", "examples/none"]:
        assert any(stale in p for p in problems), (stale, problems)
