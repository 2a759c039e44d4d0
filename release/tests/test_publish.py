"""The publisher (release/publish.py) against moto's server: three regions x two architectures,
a failure halfway and the resume, `latest` written last, a tampered zip refused."""
from __future__ import annotations

import json
import shutil

import boto3
import pytest

import publish
from conftest import ROOT, fake_release

REGIONS = ["us-east-1", "eu-west-1", "ap-southeast-2"]
ARGS = ["--regions", ",".join(REGIONS), "--arch", "x86_64,arm64"]
MUTATING = {"publish_layer_version", "add_layer_version_permission", "put_parameter"}


def ssm_value(region: str, name: str):
    try:
        return boto3.client("ssm", region_name=region).get_parameter(Name=name)["Parameter"]["Value"]
    except boto3.client("ssm", region_name=region).exceptions.ParameterNotFound:
        return None


def versions(region: str, name: str) -> list[dict]:
    lam = boto3.client("lambda", region_name=region)
    return lam.list_layer_versions(LayerName=name)["LayerVersions"]


def test_publishes_three_regions_two_arches_verified_and_latest_last(tmp_path, recorder):
    dist = tmp_path / "dist"
    manifest = fake_release(dist)
    assert publish.main(["publish", "--dist", str(dist), *ARGS], recorder) == 0

    doc = json.loads((dist / "layers.json").read_text())
    assert doc["version"] == "0.1.0"
    assert len(doc["layers"]) == 6
    sealed = {e["architecture"]: e for e in manifest["zips"] if e["kind"] == "layer"}
    for x in doc["layers"]:
        region, arch = x["region"], x["architecture"]
        name = f"flightlock-{arch}-0_1_0"
        assert x["arn"].startswith(f"arn:aws:lambda:{region}:") and f":layer:{name}:" in x["arn"]
        got = boto3.client("lambda", region_name=region).get_layer_version(
            LayerName=name, VersionNumber=x["layer_version"])
        assert got["Content"]["CodeSha256"] == sealed[arch]["code_sha256"] == x["code_sha256"]
        assert got["CompatibleArchitectures"] == [arch]
        assert got["Description"] == f"flightlock 0.1.0 (commit 0123456789ab) {arch}"
        assert ssm_value(region, f"/flightlock/layer/{arch}/0.1.0") == x["arn"]
        assert ssm_value(region, f"/flightlock/layer/{arch}/latest") == x["arn"]

    # `latest` is written after every layer and every versioned parameter, and after the last check.
    calls = recorder.calls
    latest_writes = [i for i, c in enumerate(calls) if c[2] == "put_parameter" and i >= 0]
    assert len(latest_writes) == 12  # 6 versioned, then 6 latest
    first_latest = latest_writes[6]
    last_check = max(i for i, c in enumerate(calls) if c[2] in ("get_layer_version", "get_layer_version_policy"))
    assert last_check < first_latest
    assert all(c[2] in ("get_parameter", "put_parameter") for c in calls[first_latest - 1:])
    assert recorder.methods().count("publish_layer_version") == 6


def test_a_failure_halfway_publishes_no_latest_and_a_rerun_resumes(tmp_path, recorder, capsys):
    dist = tmp_path / "dist"
    fake_release(dist)
    recorder.fail_on("publish_layer_version", 4)  # eu-west-1 arm64
    assert publish.main(["publish", "--dist", str(dist), *ARGS], recorder) == 1
    err = capsys.readouterr().err
    assert "injected" in err and "run the same command again to resume" in err
    for region in REGIONS:
        for arch in ("x86_64", "arm64"):
            assert ssm_value(region, f"/flightlock/layer/{arch}/latest") is None
    assert not (dist / "layers.json").exists()
    assert len(versions("eu-west-1", "flightlock-x86_64-0_1_0")) == 1
    assert ssm_value("eu-west-1", "/flightlock/layer/x86_64/0.1.0") is not None

    rerun = type(recorder)()
    assert publish.main(["publish", "--dist", str(dist), *ARGS], rerun) == 0
    # The three that landed are kept (not published again); the other three are published.
    assert rerun.methods().count("publish_layer_version") == 3
    assert "keep arn:aws:lambda:us-east-1:" in capsys.readouterr().out
    for region in REGIONS:
        for arch in ("x86_64", "arm64"):
            assert len(versions(region, f"flightlock-{arch}-0_1_0")) == 1
            arn = ssm_value(region, f"/flightlock/layer/{arch}/0.1.0")
            assert arn and ssm_value(region, f"/flightlock/layer/{arch}/latest") == arn

    # A third run changes nothing.
    third = type(recorder)()
    assert publish.main(["publish", "--dist", str(dist), *ARGS], third) == 0
    assert not MUTATING & set(third.methods())


def test_a_tampered_zip_is_refused_before_any_call(tmp_path, recorder, capsys):
    dist = tmp_path / "dist"
    fake_release(dist)
    z = dist / "flightlock-layer-arm64.zip"
    data = bytearray(z.read_bytes())
    data[40] ^= 1
    z.write_bytes(bytes(data))
    assert publish.main(["publish", "--dist", str(dist), *ARGS], recorder) == 1
    assert "is not the manifest's" in capsys.readouterr().err
    assert recorder.calls == []


def test_a_zip_changed_after_the_check_is_refused_as_it_is_read(tmp_path):
    dist = tmp_path / "dist"
    fake_release(dist)
    release = publish.Release.load(dist)
    (dist / "flightlock-layer-x86_64.zip").write_bytes(b"PK not the sealed zip")
    with pytest.raises(publish.PublishError, match="not the sealed one"):
        release.layer_bytes("x86_64")


def test_the_same_version_with_other_bytes_is_an_error(tmp_path, recorder, capsys):
    first = tmp_path / "a"
    fake_release(first)
    assert publish.main(["publish", "--dist", str(first), *ARGS], recorder) == 0
    latest = ssm_value("us-east-1", "/flightlock/layer/x86_64/latest")
    capsys.readouterr()

    other = tmp_path / "b"
    fake_release(other, salt=b" rebuilt")
    again = type(recorder)()
    assert publish.main(["publish", "--dist", str(other), *ARGS], again) == 1
    assert "a release's bytes never change" in capsys.readouterr().err
    assert not MUTATING & set(again.methods())
    assert ssm_value("us-east-1", "/flightlock/layer/x86_64/latest") == latest
    assert publish.main(["plan", "--dist", str(other), *ARGS], type(recorder)()) == 1


def test_plan_changes_nothing_and_says_what_publish_would_do(tmp_path, recorder, capsys):
    dist = tmp_path / "dist"
    fake_release(dist)
    assert publish.main(["plan", "--dist", str(dist), *ARGS], recorder) == 0
    out = capsys.readouterr().out
    assert out.count("publish flightlock-") == 6
    assert out.count("once every region is verified") == 6
    assert not MUTATING & set(recorder.methods())
    assert versions("us-east-1", "flightlock-x86_64-0_1_0") == []

    assert publish.main(["publish", "--dist", str(dist), *ARGS], recorder) == 0
    capsys.readouterr()
    after = type(recorder)()
    assert publish.main(["plan", "--dist", str(dist), *ARGS], after) == 0
    out = capsys.readouterr().out
    assert out.count("keep arn:") == 6 and "publish flightlock-" not in out
    assert not MUTATING & set(after.methods())


@pytest.mark.parametrize("principal", ["210987654321", "o-abcdef1234"])
def test_an_account_or_an_organization_is_granted_and_verified(tmp_path, recorder, principal):
    dist = tmp_path / "dist"
    fake_release(dist, arches=("x86_64",))
    args = ["publish", "--dist", str(dist), "--regions", "us-east-1", "--arch", "x86_64", "--principal", principal]
    assert publish.main(args, recorder) == 0
    policy = boto3.client("lambda", region_name="us-east-1").get_layer_version_policy(
        LayerName="flightlock-x86_64-0_1_0", VersionNumber=1)["Policy"]
    (st,) = json.loads(policy)["Statement"]
    assert publish.Principal.parse(principal).matches(st), st
    assert not publish.Principal.parse("*").matches(st), st


def test_a_statement_that_grants_someone_else_is_an_error(tmp_path, recorder, capsys):
    dist = tmp_path / "dist"
    fake_release(dist, arches=("x86_64",))
    base = ["--dist", str(dist), "--regions", "us-east-1", "--arch", "x86_64"]
    assert publish.main(["publish", *base], recorder) == 0
    lam = boto3.client("lambda", region_name="us-east-1")
    lam.remove_layer_version_permission(LayerName="flightlock-x86_64-0_1_0", VersionNumber=1,
                                        StatementId="flightlock-public")
    lam.add_layer_version_permission(LayerName="flightlock-x86_64-0_1_0", VersionNumber=1,
                                     StatementId="flightlock-public", Action="lambda:GetLayerVersion",
                                     Principal="210987654321")
    capsys.readouterr()
    assert publish.main(["publish", *base], type(recorder)()) == 1
    assert "does not grant lambda:GetLayerVersion to *" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["", "everyone", "12345", "o-short", "arn:aws:iam::210987654321:root"])
def test_a_bad_principal_names_the_accepted_forms(bad):
    with pytest.raises(publish.PublishError, match=r"--principal .*accepted are '\*'"):
        publish.Principal.parse(bad)


def test_a_dirty_build_is_not_published(tmp_path, recorder, capsys):
    dist = tmp_path / "dist"
    manifest = fake_release(dist)
    import pack
    pack.seal(dist, manifest["version"], manifest["commit"], dirty=True)
    assert publish.main(["plan", "--dist", str(dist), *ARGS], recorder) == 1
    assert "uncommitted changes" in capsys.readouterr().err


def test_the_arn_table_is_generated_from_layers_json(tmp_path, recorder):
    dist = tmp_path / "dist"
    fake_release(dist)
    assert publish.main(["publish", "--dist", str(dist), *ARGS], recorder) == 0
    page = tmp_path / "layers.md"
    shutil.copy(ROOT / "docs/src/reference/layers.md", page)
    before = page.read_text()
    assert publish.main(["table", "--layers-json", str(dist / "layers.json"), "--page", str(page)]) == 0
    text = page.read_text()
    doc = json.loads((dist / "layers.json").read_text())
    for x in doc["layers"]:
        assert f"`{x['arn']}`" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and ":layer:" in line]
    assert sorted(r.split(" | ")[0][2:] for r in rows) == sorted(REGIONS)
    assert all(r.count("`arn:aws:lambda:") == 2 for r in rows)
    # Only the generated part changed.
    assert text.split(publish.TABLE_BEGIN)[0] == before.split(publish.TABLE_BEGIN)[0]
    assert text.split(publish.TABLE_END)[1] == before.split(publish.TABLE_END)[1]
    # Generating again gives the same page.
    assert publish.main(["table", "--layers-json", str(dist / "layers.json"), "--page", str(page)]) == 0
    assert page.read_text() == text


def test_the_committed_page_says_there_is_no_release_yet():
    text = (ROOT / "docs/src/reference/layers.md").read_text()
    generated = text.split(publish.TABLE_BEGIN)[1].split(publish.TABLE_END)[0]
    assert "No release has been published yet" in generated


def test_verify_refuses_a_layer_that_is_not_the_sealed_one(tmp_path, recorder):
    dist = tmp_path / "dist"
    fake_release(dist, arches=("x86_64",))
    args = ["publish", "--dist", str(dist), "--regions", "us-east-1", "--arch", "x86_64"]
    assert publish.main(args, recorder) == 0
    release = publish.Release.load(dist)
    lam = boto3.client("lambda", region_name="us-east-1")
    name = "flightlock-x86_64-0_1_0"
    principal = publish.Principal.parse("*")
    publish.verify(lam, release, "us-east-1", "x86_64", principal, name, 1)
    release.zips["x86_64"] = dict(release.zips["x86_64"], code_sha256="AAAA", size=1)
    with pytest.raises(publish.PublishError, match="CodeSha256 .*expected AAAA; CodeSize .*expected 1"):
        publish.verify(lam, release, "us-east-1", "x86_64", principal, name, 1)
    with pytest.raises(publish.PublishError, match="no statement flightlock-account-210987654321"):
        publish.verify(lam, publish.Release.load(dist), "us-east-1", "x86_64",
                       publish.Principal.parse("210987654321"), name, 1)


def test_statements_are_read_in_the_forms_aws_documents():
    base = {"Sid": "s", "Effect": "Allow", "Action": "lambda:GetLayerVersion", "Resource": "arn"}
    public = dict(base, Principal="*")
    # AddLayerVersionPermission's documented policy forms: an account as its root ARN, an
    # Organization as a condition on aws:PrincipalOrgID.
    account = dict(base, Principal={"AWS": "arn:aws:iam::210987654321:root"})
    org = dict(public, Condition={"StringEquals": {"aws:PrincipalOrgID": "o-abcdef1234"}})
    p_public, p_account, p_org = (publish.Principal.parse(x) for x in ("*", "210987654321", "o-abcdef1234"))
    assert p_public.matches(public) and not p_public.matches(org) and not p_public.matches(account)
    assert p_account.matches(account) and not p_account.matches(public)
    assert p_org.matches(org) and not p_org.matches(public)
    assert not p_org.matches(dict(org, Condition={"StringEquals": {"aws:PrincipalOrgID": "o-other12345"}}))
    assert not p_public.matches(dict(public, Effect="Deny"))
    assert not p_public.matches(dict(public, Action="lambda:*"))
