"""The documentation: the site under docs/ builds with `mkdocs build --strict` (a broken link, a
moved anchor, a page left out of the nav or a hook that lost its marker fail it), its command-line
page holds every flag of every subcommand, and README.md stays a front page whose links into the
docs lead somewhere."""

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    return out


def built_page(site: Path, source: str) -> Path:
    """The HTML mkdocs writes for docs/SOURCE (use_directory_urls: x.md -> x/index.html)."""
    stem = source.removesuffix(".md")
    return site / "index.html" if stem == "index" else site / stem / "index.html"


def test_site_builds_strict_with_every_page_and_plot(site):
    for page in (REPO / "docs").glob("*.md"):
        assert built_page(site, page.name).is_file(), page.name
    # the plots are served from benchmarks/results/, where the benchmarks write them, and each is
    # shown on some page
    pages = "".join(page.read_text() for page in (REPO / "docs").glob("*.md"))
    for png in (REPO / "benchmarks" / "results").glob("*.png"):
        assert (site / "img" / png.name).is_file(), png.name
        assert f"](img/{png.name})" in pages, f"no page shows {png.name}"


def test_cli_page_lists_every_flag_of_every_subcommand(site):
    from radixkv.cli import build_parser

    html = built_page(site, "cli.md").read_text()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert len(sub.choices) >= 6
    for name, parser in sub.choices.items():
        assert f'id="radixkv-{name}"' in html, name
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            names = action.option_strings or [action.metavar or action.dest]
            for flag in names:
                assert f"<code>{flag}" in html, (name, flag)


def test_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) < 250
    assert "../shared" not in text
    # the two set-up commands: the main job and the tests, the latter what .ci/run runs
    assert "radixkv generate" in text and "python -m pytest" in text
    ci = (REPO / ".ci" / "run").read_text()
    test_command = next(line for line in ci.splitlines() if "python -m pytest" in line)
    assert test_command in text, "the README's test command is not the one .ci/run runs"


def test_readme_links_into_the_docs_lead_somewhere(site):
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+:", link) and not link.startswith("#")]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        path, _, anchor = link.partition("#")
        assert (REPO / path).exists(), link
        if anchor and path.startswith("docs/") and path.endswith(".md"):
            assert f'id="{anchor}"' in built_page(site, path.removeprefix("docs/")).read_text(), link


def test_no_page_points_outside_the_repository():
    for page in [README, *(REPO / "docs").rglob("*.md")]:
        assert "../shared" not in page.read_text(), page
