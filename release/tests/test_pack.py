"""release/pack.py: reproducible zips, the manifest's hashes, the size gate, the SBOM."""
from __future__ import annotations

import json
import os
import re
import shutil
import zipfile

import pytest

import pack
from conftest import ROOT, fake_release


def test_packing_the_same_binaries_twice_gives_the_same_bytes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    (a / "ext").write_bytes(os.urandom(200_000))
    shutil.copy(ROOT / "extension/layer/flightlock-wrapper", a / "wrapper")
    shutil.copytree(a, b)
    # Other times and modes on the second copy: none of it may reach the zip.
    for f in b.iterdir():
        os.utime(f, (1_900_000_000, 1_900_000_000))
        f.chmod(0o600)
    pack.layer_zip(a / "ext", a / "wrapper", tmp_path / "one.zip")
    pack.layer_zip(b / "ext", b / "wrapper", tmp_path / "two.zip")
    assert (tmp_path / "one.zip").read_bytes() == (tmp_path / "two.zip").read_bytes()

    with zipfile.ZipFile(tmp_path / "one.zip") as z:
        infos = z.infolist()
        clients = [name for name, _ in pack.client_files()]
        assert [i.filename for i in infos] == sorted(["extensions/flightlock", "flightlock-wrapper", *clients])
        for i in infos:
            assert i.date_time == pack.FIXED_TIME
            mode = 0o100644 if i.filename in clients else 0o100755
            assert i.external_attr >> 16 == mode, (i.filename, oct(i.external_attr >> 16))
            assert i.create_system == 3
        assert z.read("extensions/flightlock") == (a / "ext").read_bytes()


def test_the_manifest_has_sha256_code_sha256_size_and_architecture(tmp_path):
    m = fake_release(tmp_path / "dist")
    assert {(e["kind"], e["architecture"]) for e in m["zips"]} == {
        (k, a) for k in ("layer", "function") for a in pack.ARCHES}
    for e in m["zips"]:
        data = (tmp_path / "dist" / e["file"]).read_bytes()
        assert e["size"] == len(data)
        assert e["sha256"] == pack.hashlib.sha256(data).hexdigest()
        assert pack.base64.b64decode(e["code_sha256"]) == pack.hashlib.sha256(data).digest()
    # Lambda's CodeSha256 of an empty file, as AWS documents the form (base64 of the digest).
    assert pack.code_sha256(pack.hashlib.sha256(b"").hexdigest()) == "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
    sums = (tmp_path / "dist/SHA256SUMS").read_text().splitlines()
    assert f"{m['zips'][0]['sha256']}  {m['zips'][0]['file']}" in sums
    assert any(line.endswith("  manifest.json") for line in sums)
    assert json.loads((tmp_path / "dist/manifest.json").read_text()) == m


def test_a_changed_zip_fails_the_check(tmp_path):
    fake_release(tmp_path / "dist")
    pack.load_verified(tmp_path / "dist")
    z = tmp_path / "dist/flightlock-cleanup-x86_64.zip"
    z.write_bytes(z.read_bytes() + b"\0")
    with pytest.raises(pack.PackError, match="is not the manifest's"):
        pack.load_verified(tmp_path / "dist")


def test_the_size_gate_fails_the_seal(tmp_path, monkeypatch):
    fake_release(tmp_path / "dist")
    size = (tmp_path / "dist/flightlock-layer-arm64.zip").stat().st_size
    monkeypatch.setattr(pack, "LAYER_ZIP_LIMIT", size - 1)
    with pytest.raises(pack.PackError, match=f"flightlock-layer-arm64.zip is {size} bytes, over the layer limit of {size - 1}"):
        pack.seal(tmp_path / "dist", "0.1.0", "0" * 40)


def test_the_sbom_lists_what_is_compiled_into_the_extension(tmp_path):
    doc = pack.sbom(ROOT, "flightlock-extension", "aarch64-unknown-linux-gnu", "0.1.0", "0" * 40,
                    "2026-11-25T00:00:00Z")
    names = {c["name"]: c for c in doc["components"]}
    assert doc["bomFormat"] == "CycloneDX" and doc["metadata"]["component"]["name"] == "flightlock-extension"
    for dep in ("flightlock", "flightlock-lambda", "tokio", "aws-sdk-dynamodb", "hyper", "rustls"):
        assert dep in names, dep
    # Not compiled in: dev-dependencies, the CLI (the crate flightlock-cli) and its dependencies,
    # and the in-process layer's runtime (flightlock-lambda without its feature `layer`).
    for absent in ("flightlock-testkit", "flightlock-cli", "clap", "nix", "lambda_runtime"):
        assert absent not in names, absent
    assert names["tokio"]["hashes"][0]["alg"] == "SHA-256" and len(names["tokio"]["hashes"][0]["content"]) == 64
    assert names["tokio"]["purl"].startswith("pkg:cargo/tokio@")
    assert str(ROOT) not in json.dumps(doc)


def test_the_cdk_packages_are_sealed_beside_the_client_packages(tmp_path):
    dist = tmp_path / "dist"
    fake_release(dist)
    # scripts/check-cdk --pack writes the first three; the Node client's tarball differs by one word.
    cdk = ["flightlock-cdk-0.1.0.tgz", "flightlock_cdk-0.1.0-py3-none-any.whl", "flightlock_cdk-0.1.0.tar.gz"]
    for name in [*cdk, "flightlock-0.1.0.tgz"]:
        (dist / name).write_bytes(name.encode())
    m = pack.seal(dist, "0.1.0", "0" * 40)
    assert sorted(p["file"] for p in m["packages"]) == sorted([*cdk, "flightlock-0.1.0.tgz"])
    sums = (dist / "SHA256SUMS").read_text()
    assert all(f"{pack.sha256_hex(dist / name)}  {name}\n" in sums for name in cdk)
    pack.load_verified(dist)
    (dist / "flightlock_cdk-0.1.0-py3-none-any.whl").write_bytes(b"another wheel")
    with pytest.raises(pack.PackError, match="flightlock_cdk-0.1.0-py3-none-any.whl: missing, or its sha256"):
        pack.load_verified(dist)


@pytest.mark.parametrize("name", ["flightlock-cdk-0.2.0.tgz", "flightlock_cdk-0.2.0-py3-none-any.whl",
                                  "flightlock_cdk-0.2.0.tar.gz"])
def test_a_cdk_package_of_another_version_fails_the_seal(tmp_path, name):
    dist = tmp_path / "dist"
    fake_release(dist)
    (dist / name).write_bytes(b"package")
    with pytest.raises(pack.PackError, match=rf"{name}: a package of version 0\.2\.0, not the release's 0\.1\.0"):
        pack.seal(dist, "0.1.0", "0" * 40)


def test_the_node_client_and_the_cdk_tarball_are_told_apart():
    client = pack.PACKAGE_NAME.fullmatch("flightlock-0.1.0.tgz")
    assert client is not None and client.group("npm") == "0.1.0" and client.group("cdk_npm") is None
    construct = pack.PACKAGE_NAME.fullmatch("flightlock-cdk-0.1.0.tgz")
    assert construct is not None and construct.group("cdk_npm") == "0.1.0" and construct.group("npm") is None
    # jsii-pacmak's own name for the tarball is not a release name: check-cdk renames it in OUT.
    assert pack.PACKAGE_NAME.fullmatch("flightlock-cdk@0.1.0.jsii.tgz") is None


@pytest.mark.parametrize("name", ["flightlock-0.1.0-rc.1.tgz", "flightlock-cdk@0.1.0.jsii.tgz", "notes.md"])
def test_a_file_the_seal_does_not_know_fails_it_instead_of_going_out_unsealed(tmp_path, name):
    """The GitHub release attaches dist/* whole: a file left out of SHA256SUMS would be published
    unchecked (a prerelease's npm tarball, flightlock-X.Y.Z-rc.N.tgz, which PACKAGE_NAME does not
    match, was)."""
    dist = tmp_path / "dist"
    fake_release(dist)
    (dist / name).write_bytes(b"x")
    with pytest.raises(pack.PackError, match=rf"\['{re.escape(name)}'\] would not be sealed"):
        pack.seal(dist, "0.1.0", "0" * 40)
