"""The release's packaged template (release/template.py) against template.yaml: every deployable
resource and property kept, only the code locations and the per-architecture cleanup function
changed, so the two cannot drift."""
from __future__ import annotations

import copy
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

import pack
import template
from conftest import ROOT, fake_release

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def crate_version() -> str:
    return tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]


@pytest.fixture(scope="module")
def source() -> dict:
    return template.load(ROOT / "template.yaml")


@pytest.fixture(scope="module")
def packaged(tmp_path_factory) -> tuple[dict, object]:
    """A fake release's dist/ with its packaged template, written as scripts/release does."""
    dist = tmp_path_factory.mktemp("rel") / "dist"
    fake_release(dist, crate_version())
    rc = template.main(["--dist", str(dist), "--version", crate_version(), "--commit", COMMIT])
    assert rc == 0
    return template.load(dist / template.PACKAGED), dist


def test_the_release_mapping_is_the_crate_version(source):
    assert template.release_version(source) == crate_version(), (
        "template.yaml Mappings.Release.flightlock.Version is not the crates' version")


def test_every_deployable_resource_is_kept_with_every_property(source, packaged):
    out, dist = packaged
    examples = {n for n, r in source["Resources"].items() if r.get("Condition") == template.EXAMPLE_CONDITION}
    assert examples == {"DemoPythonJob", "DemoRustJob"}, examples
    cleanup_names = {name for name, _ in template.CLEANUP_BY_ARCH.values()}
    want = set(source["Resources"]) - examples - {template.CLEANUP} | cleanup_names
    assert set(out["Resources"]) == want
    for name, r in source["Resources"].items():
        if name in examples or name == template.CLEANUP:
            continue
        got = copy.deepcopy(out["Resources"][name])
        r = copy.deepcopy(r)
        if r["Type"] == "AWS::Serverless::LayerVersion":
            arch = r["Properties"]["CompatibleArchitectures"][0]
            assert got["Properties"].pop("ContentUri") == f"flightlock-layer-{arch}.zip"
            r["Properties"].pop("ContentUri")
            assert r.pop("Metadata")["BuildMethod"] == "makefile"
        assert got == r, f"{name} differs from template.yaml's"
    src = copy.deepcopy(source["Resources"][template.CLEANUP])
    assert src.pop("Metadata") == {"BuildMethod": "rust-cargolambda"}
    for arch, (name, cond) in template.CLEANUP_BY_ARCH.items():
        got = copy.deepcopy(out["Resources"][name])
        assert got.pop("Condition") == cond
        assert out["Conditions"][cond] == {"Fn::And": [{"Condition": src["Condition"]},
                                                       {"Fn::Equals": [{"Ref": "FunctionArchitecture"}, arch]}]}
        assert got["Properties"].pop("CodeUri") == f"flightlock-cleanup-{arch}.zip"
        assert got["Properties"].pop("Architectures") == [arch]
        want_r = copy.deepcopy(src)
        want_r.pop("Condition")
        want_r["Properties"].pop("CodeUri")
        want_r["Properties"].pop("Architectures")
        assert got == want_r, f"{name} differs from template.yaml's {template.CLEANUP}"
    for path in template.code_paths(out):
        assert (dist / path).is_file(), path


def test_parameters_conditions_mappings_globals_and_outputs_are_kept(source, packaged):
    out, _ = packaged
    example_only = {"ExampleJobs", "JobSchedule", "LockLease", "LockWait", "LockPermits"}
    assert set(out["Parameters"]) == set(source["Parameters"]) - example_only
    for name, p in out["Parameters"].items():
        assert p == source["Parameters"][name], name
    added = {c for _, c in template.CLEANUP_BY_ARCH.values()}
    assert set(out["Conditions"]) == set(source["Conditions"]) - {template.EXAMPLE_CONDITION} | added
    for name in set(out["Conditions"]) - added:
        assert out["Conditions"][name] == source["Conditions"][name], name
    for key in ("Transform", "AWSTemplateFormatVersion", "Mappings", "Globals"):
        assert out[key] == source[key], key
    assert set(out["Outputs"]) == set(source["Outputs"])
    for name, o in source["Outputs"].items():
        got = copy.deepcopy(out["Outputs"][name])
        if name == "CleanupFunctionName":
            assert got.pop("Value") == {"Fn::If": ["DeployCleanupArm64", {"Ref": "CleanupFunction"},
                                                   {"Ref": "CleanupFunctionX86"}]}
            o = {k: v for k, v in o.items() if k != "Value"}
        assert got == o, name
    assert out["Description"].startswith(f"flightlock {crate_version()} (commit {COMMIT[:12]})")


def test_it_is_sealed_with_the_zips(packaged):
    _, dist = packaged
    manifest = pack.seal(dist, crate_version(), COMMIT)
    assert template.PACKAGED in [t["file"] for t in manifest["templates"]]
    assert template.PACKAGED in (dist / "SHA256SUMS").read_text()
    (dist / template.PACKAGED).write_text((dist / template.PACKAGED).read_text() + "# edited\n")
    with pytest.raises(pack.PackError, match="template.yaml: sha256"):
        pack.load_verified(dist)


def test_a_version_other_than_the_templates_is_refused(tmp_path, capsys):
    dist = tmp_path / "dist"
    fake_release(dist, "9.9.9")
    assert template.main(["--dist", str(dist), "--version", "9.9.9", "--commit", COMMIT]) == 1
    assert "Release version is" in capsys.readouterr().err
    assert not (dist / template.PACKAGED).exists()


def test_a_release_of_one_architecture_is_refused(tmp_path, capsys):
    dist = tmp_path / "dist"
    fake_release(dist, crate_version(), arches=["x86_64"])
    assert template.main(["--dist", str(dist), "--version", crate_version(), "--commit", COMMIT]) == 1
    assert "lacks flightlock-layer-arm64.zip" in capsys.readouterr().err


def test_cfn_lint_accepts_it(packaged):
    _, dist = packaged
    bin_dir = Path(os.environ.get("FLIGHTLOCK_PY_BIN", ROOT / ".tools/py-venv/bin"))
    lint = bin_dir / "cfn-lint"
    assert lint.is_file(), f"{lint} not found: run scripts/python-tools (it installs cfn-lint)"
    out = subprocess.run([str(lint), str(dist / template.PACKAGED)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_sar_application_is_the_packaged_template_with_the_table_kept(packaged):
    out, dist = packaged
    app = template.load(dist / template.SAR)
    # SAR accepts the Serverless transform alone, so nothing can come from TableDeletionPolicy.
    assert app["Transform"] == "AWS::Serverless-2016-10-31"
    assert "TableDeletionPolicy" not in app["Parameters"] and "RetainTable" not in app["Conditions"]
    assert set(app["Parameters"]) == set(out["Parameters"]) - {"TableDeletionPolicy"}
    assert set(app["Resources"]) == set(out["Resources"])
    kept = {n for n, r in out["Resources"].items() if r.get("DeletionPolicy") == {"Ref": "TableDeletionPolicy"}}
    assert kept == {"LockTable", "LockTableNameParameter", "LockTableStackParameter"}, kept
    for name, r in out["Resources"].items():
        want = copy.deepcopy(r)
        if name in kept:
            want["DeletionPolicy"] = want["UpdateReplacePolicy"] = "Retain"
        if name == "LockTable":
            assert want["Properties"]["DeletionProtectionEnabled"] == {"Fn::If": ["RetainTable", True, False]}
            want["Properties"]["DeletionProtectionEnabled"] = True
        assert app["Resources"][name] == want, name
    assert app["Outputs"] == out["Outputs"]


def test_sam_publish_would_accept_the_sar_metadata(packaged):
    from serverlessrepo import parser, publish as sar_publish

    _, dist = packaged
    text = (dist / template.SAR).read_text()
    meta = parser.get_app_metadata(parser.parse_template(text))
    create = sar_publish._create_application_request(meta, text)
    version = sar_publish._create_application_version_request(
        meta, "arn:aws:serverlessrepo:us-east-1:123456789012:applications/flightlock", text)
    assert version["SemanticVersion"] == create["SemanticVersion"] == crate_version()
    assert create["SourceCodeUrl"].endswith(f"/tree/v{crate_version()}")
    # The Serverless Application Repository API's rules for these fields (CreateApplication).
    assert re.fullmatch(r"[a-zA-Z0-9\-]{1,140}", create["Name"])
    assert 1 <= len(create["Description"]) <= 256
    assert len(create["Labels"]) <= 10
    assert all(re.fullmatch(r"[a-zA-Z0-9+\-_:/@]{1,127}", label) for label in create["Labels"])
    assert create["SpdxLicenseId"] == tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["license"]
    # `sam package` uploads these files from the release's directory.
    for key in ("LicenseUrl", "ReadmeUrl"):
        assert (dist / create[key]).is_file(), create[key]
    manifest = pack.seal(dist, crate_version(), COMMIT)
    assert {t["file"] for t in manifest["templates"]} == {"template.yaml", "sar.yaml", "LICENSE", "README.md"}


def test_cfn_lint_accepts_the_sar_application(packaged):
    _, dist = packaged
    lint = Path(os.environ.get("FLIGHTLOCK_PY_BIN", ROOT / ".tools/py-venv/bin")) / "cfn-lint"
    out = subprocess.run([str(lint), str(dist / template.SAR)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
