"""The clients in the layer (issue 44): release/pack.py and the Makefile lay out the same files,
python/flightlock from clients/python/src/flightlock and nodejs/node_modules/flightlock from
clients/node (package.json and what its "files" names); the seal refuses a layer without them and
seals the client packages (wheel, sdist, npm tarball) of the release's version."""
from __future__ import annotations

import json
import shutil
import subprocess
import zipfile

import pytest

import pack
from conftest import ROOT, fake_release

WRAPPER = ROOT / "extension/layer/flightlock-wrapper"


def test_the_layer_carries_both_clients_byte_for_byte(tmp_path):
    ext = tmp_path / "ext"
    ext.write_bytes(b"\x7fELF fake")
    pack.layer_zip(ext, WRAPPER, tmp_path / "layer.zip")
    files = dict(pack.client_files())
    assert "python/flightlock/__init__.py" in files and "python/flightlock/py.typed" in files
    assert "nodejs/node_modules/flightlock/package.json" in files
    node = json.loads((ROOT / "clients/node/package.json").read_text())
    assert {f"nodejs/node_modules/flightlock/{n}" for n in node["files"]} <= set(files)
    python = {p.name for p in (ROOT / "clients/python/src/flightlock").iterdir() if p.suffix == ".py"}
    assert {f"python/flightlock/{n}" for n in python} <= set(files)
    with zipfile.ZipFile(tmp_path / "layer.zip") as z:
        for name, src in files.items():
            assert z.read(name) == src.read_bytes(), name


def test_the_makefile_lays_out_what_pack_py_packs(tmp_path):
    # The Makefile's zip_layer (make layer) and release/pack.py (scripts/release) build the same
    # layer; the extension build is skipped (-o) and a fake binary stands in for it.
    (tmp_path / "lambda/x86_64/extensions").mkdir(parents=True)
    (tmp_path / "lambda/x86_64/extensions/flightlock-extension").write_bytes(b"\x7fELF fake")
    subprocess.run(["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "-o", "extension-x86_64",
                    "layer-x86_64", f"LAMBDA_DIR={tmp_path / 'lambda'}", f"LAYER_DIR={tmp_path / 'layer'}"],
                   check=True, capture_output=True)
    with zipfile.ZipFile(tmp_path / "layer/flightlock-layer-x86_64.zip") as z:
        made = sorted(n for n in z.namelist() if not n.endswith("/"))
    packed = sorted(name for name, _, _ in pack.layer_entries(tmp_path / "e", WRAPPER))
    assert made == packed
    # SAM's makefile build (build-FlightlockLayerX86) lays out the same files.
    art = tmp_path / "artifacts"
    subprocess.run(["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "-o", "extension-x86_64",
                    "build-FlightlockLayerX86", f"LAMBDA_DIR={tmp_path / 'lambda'}", f"ARTIFACTS_DIR={art}"],
                   check=True, capture_output=True)
    assert sorted(str(p.relative_to(art)) for p in art.rglob("*") if p.is_file()) == packed


def test_the_seal_refuses_a_layer_without_the_clients(tmp_path):
    dist = tmp_path / "dist"
    fake_release(dist)
    ext = tmp_path / "ext"
    ext.write_bytes(b"\x7fELF fake")
    pack.write_zip(dist / "flightlock-layer-x86_64.zip",
                   [("extensions/flightlock", ext, 0o755), ("flightlock-wrapper", WRAPPER, 0o755)])
    with pytest.raises(pack.PackError, match=r"not the layer \(missing \['nodejs/node_modules/flightlock/"):
        pack.seal(dist, "0.1.0", "0" * 40)


def test_a_files_entry_that_is_not_a_file_is_refused(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(ROOT / "clients/python/src", root / "clients/python/src")
    shutil.copytree(ROOT / "clients/node", root / "clients/node", ignore=shutil.ignore_patterns("node_modules"))
    package = json.loads((root / "clients/node/package.json").read_text())
    package["files"].append("dist/")
    (root / "clients/node/package.json").write_text(json.dumps(package))
    with pytest.raises(pack.PackError, match=r"'dist/' is not a file of clients/node"):
        pack.client_files(root)


def test_the_client_packages_are_sealed_and_checked(tmp_path):
    dist = tmp_path / "dist"
    fake_release(dist)
    for name in ("flightlock_client-0.1.0-py3-none-any.whl", "flightlock_client-0.1.0.tar.gz", "flightlock-0.1.0.tgz"):
        (dist / name).write_bytes(name.encode())
    m = pack.seal(dist, "0.1.0", "0" * 40)
    assert sorted(p["file"] for p in m["packages"]) == [
        "flightlock-0.1.0.tgz", "flightlock_client-0.1.0-py3-none-any.whl", "flightlock_client-0.1.0.tar.gz"]
    sums = (dist / "SHA256SUMS").read_text()
    assert all(p["sha256"] + "  " + p["file"] in sums for p in m["packages"])
    pack.load_verified(dist)
    (dist / "flightlock-0.1.0.tgz").write_bytes(b"another tarball")
    with pytest.raises(pack.PackError, match="flightlock-0.1.0.tgz: missing, or its sha256"):
        pack.load_verified(dist)


def test_a_client_package_of_another_version_fails_the_seal(tmp_path):
    dist = tmp_path / "dist"
    fake_release(dist)
    (dist / "flightlock_client-0.2.0-py3-none-any.whl").write_bytes(b"wheel")
    with pytest.raises(pack.PackError, match="version 0.2.0, not the release's 0.1.0"):
        pack.seal(dist, "0.1.0", "0" * 40)
