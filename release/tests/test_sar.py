"""release/sar.yaml: the SAR application's metadata, checked offline with the library `sam publish`
uses (serverlessrepo) and SAR's documented field rules, and its SemanticVersion against the crate."""
from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

from serverlessrepo import parser, publish as sar_publish

import pack
from conftest import ROOT

TEMPLATE = ROOT / "release/sar.yaml"
# semver.org's regular expression (SAR requires a semantic version).
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?")


def crate_version() -> str:
    return tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]


def template() -> dict:
    return parser.parse_template(TEMPLATE.read_text())


def test_semantic_version_is_the_crate_version():
    meta = parser.get_app_metadata(template())
    v = crate_version()
    assert meta.semantic_version == v, f"release/sar.yaml SemanticVersion {meta.semantic_version}, crate {v}"
    assert meta.source_code_url.endswith(f"/tree/v{v}")
    for name, res in template()["Resources"].items():
        assert f"flightlock {v} " in res["Properties"]["Description"], name


def test_sam_publish_would_accept_the_metadata():
    t = template()
    meta = parser.get_app_metadata(t)
    # What `sam publish` builds for CreateApplication and CreateApplicationVersion (both validate).
    create = sar_publish._create_application_request(meta, TEMPLATE.read_text())
    version = sar_publish._create_application_version_request(meta, "arn:aws:serverlessrepo:us-east-1:123456789012:applications/x", TEMPLATE.read_text())
    assert version["SemanticVersion"] == crate_version()
    # The Serverless Application Repository API's rules for these fields (CreateApplication).
    assert re.fullmatch(r"[a-zA-Z0-9\-]{1,140}", create["Name"])
    assert re.fullmatch(r"[a-z0-9](([a-z0-9]|-(?!-))*[a-z0-9])?", create["Author"]) and len(create["Author"]) <= 127
    assert 1 <= len(create["Description"]) <= 256
    assert len(create["Labels"]) <= 10
    assert all(re.fullmatch(r"[a-zA-Z0-9+\-_:/@]{1,127}", label) for label in create["Labels"])
    assert SEMVER.fullmatch(create["SemanticVersion"])
    assert create["SpdxLicenseId"] == tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["license"]
    for url in ("HomePageUrl", "SourceCodeUrl"):
        assert create[url].startswith("https://")
    # `sam package` uploads these local files: they must exist.
    for key in ("LicenseUrl", "ReadmeUrl"):
        assert (TEMPLATE.parent / create[key]).is_file(), create[key]
    # The stripped template (what SAR stores) keeps only the layer.
    stripped = parser.strip_app_metadata(t)
    assert "AWS::ServerlessRepo::Application" not in stripped.get("Metadata", {})


def test_the_only_resource_is_the_layer_from_the_sealed_zips():
    t = template()
    resources = t["Resources"]
    assert {r["Type"] for r in resources.values()} == {"AWS::Serverless::LayerVersion"}
    arches = set()
    for res in resources.values():
        p = res["Properties"]
        kind, arch = pack.zip_kind(Path(p["ContentUri"]).name)
        assert kind == "layer" and p["CompatibleArchitectures"] == [arch]
        assert Path(p["ContentUri"]).parent == Path("../dist")
        arches.add(arch)
        # One layer per deployment: each resource exists for one value of Architecture.
        assert t["Conditions"][res["Condition"]] == {"Fn::Equals": [{"Ref": "Architecture"}, arch]}
    assert arches == set(pack.ARCHES) == set(t["Parameters"]["Architecture"]["AllowedValues"])


def test_cfn_lint_accepts_the_template():
    bin_dir = Path(os.environ.get("FLIGHTLOCK_PY_BIN", ROOT / ".tools/py-venv/bin"))
    lint = bin_dir / "cfn-lint"
    assert lint.is_file(), f"{lint} not found: run scripts/python-tools (it installs cfn-lint)"
    out = subprocess.run([str(lint), str(TEMPLATE)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
