"""The manuals say what the repository has: every relative link and anchor of README.md and docs/*.md resolves,
every `make <target>` they name is a Makefile target, every `python -m <module>` is a module here (or installed),
and config.properties' comments on the lanes' threads agree with the values the archives' model-config.yaml set."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from handlers.settings import HandlerSettings
from models import registry
from scripts.layout import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`((?:[^`\n]|\n(?!\s*\n))+)`")  # a span may wrap, within its paragraph
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
MAKE = re.compile(r"(?:^|[\s;(&|])make\s+((?:[A-Z_]+=\S*\s+)*)([a-z][a-z0-9-]*)")
PYTHON_M = re.compile(r"python(?:3(?:\.\d+)?)?\s+-m\s+([A-Za-z_][\w.]*)")


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def prose(text: str) -> str:
    """The text outside fenced code blocks (links and headings there are examples, not the page's own)."""
    return FENCE.sub("", text)


def code(text: str) -> list[str]:
    """Fenced blocks and inline code spans: where a page names a command."""
    return [match.group(0) for match in FENCE.finditer(text)] + CODE_SPAN.findall(FENCE.sub("", text))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text lowercased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in HEADING.findall(prose(page.read_text())):
        slug = anchor(heading)
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found | set(re.findall(r'<a id="([^"]+)"', page.read_text()))


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*)(?:\s+[a-z][\w./-]*)*\s*&?:(?!=)", text, re.MULTILINE))
    for phony in re.findall(r"^\.PHONY:((?:.*\\\n)*.*)$", text, re.MULTILINE):
        targets |= set(phony.replace("\\\n", " ").split())
    return targets


def module_exists(name: str) -> bool:
    parts = Path(*name.split("."))
    if (ROOT / parts).with_suffix(".py").is_file() or (ROOT / parts / "__main__.py").is_file():
        return True
    if (ROOT / name.split(".")[0]).exists():  # a module of this repository that is not there
        return False
    return importlib.util.find_spec(name) is not None


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not checked here
            continue
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no {linked}")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading #{fragment} in {linked.name}")
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_make_target_a_page_names_exists(page):
    targets = make_targets()
    named = {match.group(2) for block in code(page.read_text()) for match in MAKE.finditer(block)}
    assert sorted(named - targets) == []


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_python_module_a_page_names_exists(page):
    named = {name for block in code(page.read_text()) for name in PYTHON_M.findall(block)}
    assert sorted(name for name in named if not module_exists(name)) == []


def test_the_makefile_parser_sees_the_targets_and_the_pages_name_them():
    """The checks above compare against something: the Makefile's targets, and pages that name them all."""
    targets = make_targets()
    assert {"serve", "stop", "archive", "test", "lint", "bench", "batch-job", "gpu-check"} <= targets
    documented = {match.group(2) for page in PAGES for block in code(page.read_text()) for match in MAKE.finditer(block)}
    user_targets = set(re.search(r"^\.PHONY:((?:.*\\\n)*.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE).group(1).split())
    assert sorted(user_targets - {"\\"} - documented) == []


def test_anchor_follows_githubs_rule():
    assert anchor("Budgets per lane") == "budgets-per-lane"
    assert anchor("`make bench`: what it runs (and why)") == "make-bench-what-it-runs-and-why"
    assert anchor("Peers' sweeps, the best kept") == "peers-sweeps-the-best-kept"


# -- section references in code, config and docs ---------------------------------------------------------

SECTION_REF = re.compile(r"\b(?:docs/)?([a-z][a-z-]*\.md)[,:]?\s+\(?\"([^\"]{3,60})\"")
BOLD_LEAD = re.compile(r"^(?:<a id=\"[^\"]+\"></a>)?\*\*([^*]+?)\.?\*\*", re.MULTILINE)


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    kinds = (".py", ".md", ".yaml", ".yml", ".properties", ".xml", ".conf", ".sh", ".toml", ".txt")
    return [ROOT / name for name in listed if name.endswith(kinds) or name in ("Makefile", "Dockerfile")]


def section_names(page: Path) -> list[str]:
    """Headings (without a leading `4.`-style number) and bold paragraph leads (`**Warm-up.**`) of a page."""
    text = prose(page.read_text())
    headings = [re.sub(r"^\d+[a-z]?\.\s+", "", heading).replace("`", "") for heading in HEADING.findall(text)]
    return [name.lower() for name in headings + BOLD_LEAD.findall(text)]


def test_every_quoted_section_of_a_doc_exists():
    """`docs/hardening.md, "Limits"` in a comment names a heading (or a bold paragraph lead) that starts so."""
    broken = []
    for path in tracked_text_files():
        if not path.is_file():
            continue
        for page_name, section in SECTION_REF.findall(path.read_text(errors="replace")):
            page = ROOT / ("README.md" if page_name == "README.md" else f"docs/{page_name}")
            if not page.exists():
                continue  # another folder's page (deploy/kserve/schema/README.md): the link check covers docs
            section = re.sub(r"[\s#]+", " ", section).strip()  # a quote wrapped over comment lines
            if not any(name.startswith(section.lower()) for name in section_names(page)):
                broken.append(f"{path.relative_to(ROOT)}: {page_name} has no section {section!r}")
    assert broken == []


# -- config comments against the values they describe ------------------------------------------------------

WORD_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4}
WORKERS = re.compile(r"\b(\d+|one|two|three|four) workers? (?:of (one|\d+) torch threads?|(with torch's default threads))")


def lane_comments() -> dict[str, str]:
    """Each lane's comment in its model's model.yaml (the `#` lines just above `  <lane>: {...}`), as one line."""
    comments = {}
    for found in registry.models().values():
        above: list[str] = []
        section = ""
        for line in (found.folder / registry.MODEL_FILE).read_text().splitlines():
            if line and not line.startswith((" ", "#")):
                section = line.partition(":")[0]  # a top-level key: lanes, bench
            if line.startswith("  #"):
                above.append(line.strip().lstrip("# ").strip())
            elif line.startswith("  ") and ":" in line and section == "lanes":
                comments[line.strip().partition(":")[0]] = " ".join(above)
                above = []
            else:
                above = []
    return comments


def lane_models() -> dict[str, dict]:
    """Each lane's TorchServe entry as config.properties' models= gets it: marName and workers."""
    return {lane.name: lane.torchserve_entry()["1.0"] for lane in registry.lanes()}


def handler_settings(mar: str) -> HandlerSettings:
    """What the archive's handler reads from its model-config.yaml, resolved by the handler's own code."""
    return HandlerSettings.from_yaml(yaml.safe_load((ROOT / "models" / Path(mar).stem / "model-config.yaml").read_text()))


def test_each_lane_has_a_comment_in_its_models_folder():
    assert set(lane_comments()) == set(lane_models()) >= {"digits", "digits-bulk", "minilm", "minilm-bulk"}
    assert all(lane_comments().values())


@pytest.mark.parametrize("lane", [lane.name for lane in registry.lanes()])
def test_a_lanes_comment_on_workers_and_threads_matches_the_values(lane):
    comment, model = lane_comments()[lane], lane_models()[lane]
    settings = handler_settings(model["marName"])
    claim = WORKERS.search(comment)
    assert claim, f"{lane}: the comment does not say its workers and threads: {comment!r}"
    workers = int(WORD_NUMBERS.get(claim[1], claim[1]))
    threads = None if claim[3] else int(WORD_NUMBERS.get(claim[2], claim[2]))
    assert (workers, threads) == (model["minWorkers"], settings.threads_for(lane)), comment
    says_per_cpu = "one per CPU" in comment
    assert says_per_cpu == (settings.passes_for(lane) is None), f"{lane}: {settings.passes_for(lane)!r} passes: {comment!r}"


def readme_lane_rows() -> dict[str, str]:
    """The README's lanes table: lane -> its batching cell."""
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| [^|]+ \| ([^|]+) \|", (ROOT / "README.md").read_text(), re.MULTILINE)
    return {lane: cell for lane, cell in rows if lane in lane_models()}


@pytest.mark.parametrize("lane", ["digits", "digits-bulk", "minilm", "minilm-bulk"])
def test_the_readmes_lane_table_shows_config_properties_batching(lane):
    cell, model = readme_lane_rows()[lane], lane_models()[lane]
    settings = handler_settings(model["marName"])
    workers = int(re.search(r"(\d+) workers?", cell)[1])
    batch_size = int(re.search(r"`batchSize` (\d+)", cell)[1])
    delay = int(re.search(r"`maxBatchDelay` (\d+) ms", cell)[1])
    assert (workers, batch_size, delay) == (model["minWorkers"], model["batchSize"], model["maxBatchDelay"]), cell
    assert ("1 torch thread" in cell) == (settings.threads_for(lane) == 1), cell
    assert ("one per CPU" in cell) == (settings.passes_for(lane) is None), cell
