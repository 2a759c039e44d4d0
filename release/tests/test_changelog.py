"""CHANGELOG.md: the newest release section names the crate's version and the protocol on the
table (whether it changed), so an upgrade's reader knows if old and new layers can share keys."""
from __future__ import annotations

import re
import tomllib

from conftest import ROOT


def test_the_newest_release_names_the_crate_version_and_the_protocol():
    version = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    text = (ROOT / "CHANGELOG.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    releases = [s for s in sections if not s.startswith("[Unreleased]")]
    assert releases, "CHANGELOG.md has no release section"
    newest = releases[0]
    assert newest.startswith(f"[{version}] - "), f"the newest release section is {newest.splitlines()[0]!r}, the crate is {version}"
    assert re.search(r"^Protocol: \d+ \(.+\)$", newest, flags=re.M), \
        "the newest release section has no 'Protocol: N (first release | unchanged | changed: ...)' line"
