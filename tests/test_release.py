"""What a downstream team pins: the version, the release notes, the licence (README "Versions")."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import disagg_transforms

ROOT = Path(__file__).resolve().parent.parent
installed_wheel = pytest.mark.skipif(
    os.environ.get("DISAGG_TRANSFORMS_TEST_WHEEL") != "1",
    reason="only when CI tests the installed wheel",
)


def _pyproject_version() -> str:
    # tomllib is Python 3.11+: the one line is read by a pattern.
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'^version = "([^"]+)"$', text, flags=re.MULTILINE)
    assert match is not None
    return match[1]


def test_the_version_flag_prints_the_installed_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "disagg_transforms", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"disagg-transforms {disagg_transforms.__version__}\n"
    assert done.stderr == ""


def test_the_version_is_a_release_with_its_dated_changelog_section() -> None:
    version = _pyproject_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## \[([^\]]+)\](.*)$", changelog, flags=re.MULTILINE)
    # Keep a Changelog: an [Unreleased] section on top for what comes next, then the releases.
    assert sections[0] == ("Unreleased", "")
    assert sections[1][0] == version
    assert re.fullmatch(r" - \d{4}-\d{2}-\d{2}", sections[1][1]), sections[1]


def test_the_licence_file_is_the_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


@installed_wheel
def test_the_installed_wheel_carries_the_version_and_the_licence() -> None:
    distribution = importlib.metadata.distribution("disagg_transforms")
    assert distribution.version == _pyproject_version() == disagg_transforms.__version__
    assert distribution.metadata["License-Expression"] == "Apache-2.0"
    [licence] = [f for f in distribution.files or () if f.name == "LICENSE"]
    assert licence.read_text() == (ROOT / "LICENSE").read_text(encoding="utf-8")


def test_the_readme_links_every_topic_page_and_each_link_resolves() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = set(re.findall(r"\]\(((?:docs/)?[\w./-]+\.md|LICENSE)(?:#[\w-]+)?\)", readme))
    assert all((ROOT / link).is_file() for link in links), links
    pages = {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")}
    # The maintainers' map is reached from docs/index.md, the rest from the README itself.
    assert pages - {"docs/architecture.md"} <= links, sorted(pages - links)
