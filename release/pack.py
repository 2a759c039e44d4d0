#!/usr/bin/env python3
"""release/pack.py — seals a flightlock release in dist/ (standard library only).

Subcommands (scripts/release runs them in this order):

  layer    --arch A --extension BIN --wrapper FILE --out ZIP
           the layer zip: extensions/flightlock (the extension) and flightlock-wrapper, both 0755,
           and the handler-side clients (0644): python/flightlock/... from
           clients/python/src/flightlock, nodejs/node_modules/flightlock/... from clients/node
           (package.json and the files its "files" names: what `npm pack` packs)
  clients  --into DIR | --list
           copies the clients into DIR as the layer carries them (the Makefile's layer targets),
           or prints their names in the layer
  function --arch A --bootstrap BIN --out ZIP
           the cleanup function's zip: bootstrap, 0755
  sbom     --package P --triple T --out JSON
           CycloneDX 1.5 JSON of what is compiled into package P's binary for target T: the
           normal dependencies (`cargo tree -e normal`, features resolved for P alone), with
           versions, licenses and the sha256 from Cargo.lock
  seal     --dist DIR --version V --commit C [--dirty]
           dist/SHA256SUMS and dist/manifest.json; fails when a zip is over its size limit, when
           a layer zip lacks a file of the layer (the extension, the wrapper, each client file)
           or carries another, or when a package in dist/ (the wheel and sdist of
           clients/python, the npm tarball of clients/node, the CDK construct's npm tarball,
           wheel and sdist) is not of version V
  verify   --dist DIR
           every file the manifest names has the manifest's size and sha256 (the publisher runs
           the same check before it sends anything)

Zips are reproducible: entries in name order, every timestamp 1980-01-01 00:00:00 (the zip
format's earliest), Unix mode 0755 for executables (0644 otherwise), no extra fields, deflate
level 9. The same input bytes give the same zip bytes (with the same zlib).
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

# The size gate. The x86_64 layer zip of 0.1.0 is 5.7 MB (its extension 15.4 MB unzipped); a zip
# near three times that means something large was compiled in and deserves a look (cold start
# reads the layer). Lambda's own limits are far
# above: 50 MB zipped for a direct upload, 250 MB unzipped for a function and all its layers.
LAYER_ZIP_LIMIT = 16 * 1024 * 1024
FUNCTION_ZIP_LIMIT = 16 * 1024 * 1024
ARCHES = ("x86_64", "arm64")
FIXED_TIME = (1980, 1, 1, 0, 0, 0)


class PackError(Exception):
    """A release artifact is missing, wrong or over its limit: the message says which and why."""


def write_zip(out: Path, entries: list[tuple[str, Path, int]]) -> None:
    """Writes `entries` (name in the zip, source file, Unix mode) as a reproducible zip."""
    names = [name for name, _, _ in entries]
    if len(set(names)) != len(names):
        raise PackError(f"{out}: duplicate entries in {names}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with zipfile.ZipFile(tmp, "w") as z:
        for name, src, mode in sorted(entries):
            if not src.is_file():
                raise PackError(f"{src}: not found (the zip {out.name} needs it as {name})")
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            info.create_system = 3  # Unix, so external_attr carries the mode
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, src.read_bytes(), compresslevel=9)
    tmp.replace(out)


ROOT = Path(__file__).resolve().parent.parent
# The packages in dist/ (scripts/release builds them), all of the release's version:
#   - the Python client's wheel and sdist (distribution flightlock-client: PyPI's "flightlock" is
#     an unrelated project's; file names normalise it to flightlock_client);
#   - the Node client's npm tarball (flightlock);
#   - the CDK construct's npm tarball (flightlock-cdk) and its Python wheel and sdist
#     (flightlock_cdk), from scripts/check-cdk --pack.
# Each version group starts with a digit and has no '-', so the Node client's
# flightlock-<version>.tgz never takes flightlock-cdk-<version>.tgz, nor the reverse.
PACKAGE_NAME = re.compile(
    r"(?:flightlock_client-(?P<py>[0-9][^-]*?)(?:-py3-none-any\.whl|\.tar\.gz)"
    r"|flightlock-(?P<npm>[0-9][^-]*?)\.tgz"
    r"|flightlock_cdk-(?P<cdk_py>[0-9][^-]*?)(?:-py3-none-any\.whl|\.tar\.gz)"
    r"|flightlock-cdk-(?P<cdk_npm>[0-9][^-]*?)\.tgz)"
)


def client_files(root: Path = ROOT) -> list[tuple[str, Path]]:
    """The handler-side clients the layer carries, as (name in the layer, source file). Lambda
    puts a layer's python/ on sys.path and nodejs/node_modules on NODE_PATH, so a function with
    the layer imports `flightlock` with nothing installed."""
    python = root / "clients/python/src/flightlock"
    files = [(f"python/flightlock/{p.name}", p) for p in sorted(python.glob("*"))
             if p.is_file() and (p.suffix == ".py" or p.name == "py.typed")]
    if not any(name.endswith("/__init__.py") for name, _ in files):
        raise PackError(f"{python}: no __init__.py (the Python client the layer carries)")
    node = root / "clients/node"
    try:
        listed = json.loads((node / "package.json").read_text())["files"]
    except (OSError, ValueError, KeyError) as e:
        raise PackError(f"{node / 'package.json'}: no \"files\" list to take the layer's Node.js client from ({e})") from None
    for name in listed:
        if not isinstance(name, str) or any(c in name for c in "*?[!") or not (node / name).is_file():
            raise PackError(f"{node / 'package.json'}: \"files\" entry {name!r} is not a file of clients/node "
                            "(the layer copies exactly the files it names)")
    files += [(f"nodejs/node_modules/flightlock/{n}", node / n) for n in ["package.json", *listed]]
    return files


def layer_entries(extension: Path, wrapper: Path, root: Path = ROOT) -> list[tuple[str, Path, int]]:
    """Everything in the layer: Lambda mounts it as /opt/extensions/flightlock,
    /opt/flightlock-wrapper, /opt/python/flightlock and /opt/nodejs/node_modules/flightlock."""
    return ([("extensions/flightlock", extension, 0o755), ("flightlock-wrapper", wrapper, 0o755)]
            + [(name, src, 0o644) for name, src in client_files(root)])


def layer_zip(extension: Path, wrapper: Path, out: Path, root: Path = ROOT) -> None:
    """The layer zip (layer_entries)."""
    write_zip(out, layer_entries(extension, wrapper, root))


def copy_clients(into: Path, root: Path = ROOT) -> None:
    """The clients laid out in `into` as the layer carries them (the Makefile's layer targets)."""
    for name, src in client_files(root):
        dest = into / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(src.read_bytes())
        dest.chmod(0o644)


def function_zip(bootstrap: Path, out: Path) -> None:
    """A provided.al2023 function: the runtime runs /var/task/bootstrap."""
    write_zip(out, [("bootstrap", bootstrap, 0o755)])


def sha256_hex(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def code_sha256(sha_hex: str) -> str:
    """Lambda's `CodeSha256`: the base64 of the sha256 digest (not of its hex)."""
    return base64.b64encode(bytes.fromhex(sha_hex)).decode()


def zip_kind(name: str) -> tuple[str, str]:
    """('layer' | 'function', arch) from a release zip's file name."""
    m = re.fullmatch(r"flightlock-(layer|cleanup)-(x86_64|arm64)\.zip", name)
    if not m:
        raise PackError(f"{name}: not a release zip name (flightlock-layer-<arch>.zip, flightlock-cleanup-<arch>.zip)")
    return ("layer" if m.group(1) == "layer" else "function"), m.group(2)


def seal(dist: Path, version: str, commit: str, dirty: bool = False) -> dict:
    """Writes SHA256SUMS and manifest.json for every zip, SBOM and packaged template in `dist`;
    enforces the size gate."""
    zips = sorted(p for p in dist.glob("*.zip"))
    if not zips:
        raise PackError(f"{dist}: no zips to seal")
    entries, over = [], []
    layer_names = sorted(name for name, _, _ in layer_entries(Path("extension"), Path("wrapper")))
    for z in zips:
        kind, arch = zip_kind(z.name)
        size = z.stat().st_size
        limit = LAYER_ZIP_LIMIT if kind == "layer" else FUNCTION_ZIP_LIMIT
        if size > limit:
            over.append(f"{z.name} is {size} bytes, over the {kind} limit of {limit} bytes")
        sha = sha256_hex(z)
        with zipfile.ZipFile(z) as zf:
            unzipped = sum(i.file_size for i in zf.infolist())
            names = sorted(zf.namelist())
        if kind == "layer" and names != layer_names:
            missing, extra = sorted(set(layer_names) - set(names)), sorted(set(names) - set(layer_names))
            raise PackError(f"{z.name}: not the layer (missing {missing}, extra {extra}); "
                            "pack it with release/pack.py layer")
        entries.append({
            "file": z.name,
            "kind": kind,
            "architecture": arch,
            "size": size,
            "unzipped_size": unzipped,
            "size_limit": limit,
            "sha256": sha,
            "code_sha256": code_sha256(sha),
        })
    if over:
        raise PackError("size gate: " + "; ".join(over) + " (release/pack.py LAYER_ZIP_LIMIT, FUNCTION_ZIP_LIMIT)")
    sboms = sorted(p.name for p in dist.glob("*.cdx.json"))
    # The packaged templates and the files the SAR one names (release/template.py), if any.
    templates = sorted(p.name for p in dist.iterdir() if p.name in ("template.yaml", "sar.yaml", "LICENSE", "README.md"))
    packages = []
    for p in sorted(dist.glob("flightlock*")):
        m = PACKAGE_NAME.fullmatch(p.name)
        if not m:
            continue
        found = m.group("py") or m.group("npm") or m.group("cdk_py") or m.group("cdk_npm")
        if found != version:
            raise PackError(f"{p.name}: a package of version {found}, not the release's {version} "
                            "(the clients and the CDK construct follow the workspace version in Cargo.toml)")
        packages.append({"file": p.name, "size": p.stat().st_size, "sha256": sha256_hex(p)})
    # Every file of dist/ is sealed: the GitHub release attaches dist/* whole, so a file the seal
    # does not know (a package whose name the pattern above misses, such as a prerelease's npm
    # tarball, flightlock-X.Y.Z-rc.N.tgz) would be published unchecked. It is an error instead.
    sealed = {z.name for z in zips} | set(sboms) | set(templates) | {e["file"] for e in packages}
    unknown = sorted(p.name for p in dist.iterdir() if p.name not in sealed | {"manifest.json", "SHA256SUMS"})
    if unknown:
        raise PackError(f"{dist}: {unknown} would not be sealed (not a zip, SBOM, template or package of "
                        f"version {version} that release/pack.py knows); remove them or teach PACKAGE_NAME")
    manifest = {
        "packages": packages,
        "name": "flightlock",
        "version": version,
        "commit": commit,
        "dirty": dirty,
        "zips": entries,
        "sboms": [{"file": s, "sha256": sha256_hex(dist / s)} for s in sboms],
        "templates": [{"file": s, "sha256": sha256_hex(dist / s)} for s in templates],
    }
    (dist / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    sums = [(e["sha256"], e["file"]) for e in entries] + [(sha256_hex(dist / s), s) for s in sboms + templates]
    sums += [(p["sha256"], p["file"]) for p in packages]
    sums.append((sha256_hex(dist / "manifest.json"), "manifest.json"))
    (dist / "SHA256SUMS").write_text("".join(f"{h}  {n}\n" for h, n in sorted(sums, key=lambda x: x[1])))
    return manifest


def load_verified(dist: Path) -> dict:
    """The manifest, after checking that every file it names has its size and sha256.

    Every step after `seal` (the publisher too) goes through this: a zip whose bytes are not the
    manifest's is refused, whatever changed it.
    """
    path = dist / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise PackError(f"{path}: not found; build the release first (scripts/release)") from None
    except json.JSONDecodeError as e:
        raise PackError(f"{path}: not JSON ({e})") from None
    for key in ("version", "commit", "zips"):
        if key not in manifest:
            raise PackError(f"{path}: no '{key}'")
    for e in manifest["zips"]:
        f = dist / e["file"]
        if not f.is_file():
            raise PackError(f"{f}: named in the manifest but missing")
        sha = sha256_hex(f)
        if sha != e["sha256"]:
            raise PackError(f"{f}: sha256 {sha} is not the manifest's {e['sha256']}; refusing a zip that is not the sealed one")
        if f.stat().st_size != e["size"]:
            raise PackError(f"{f}: {f.stat().st_size} bytes, the manifest says {e['size']}")
        if code_sha256(sha) != e["code_sha256"]:
            raise PackError(f"{path}: code_sha256 of {e['file']} does not match its sha256")
        kind, arch = zip_kind(e["file"])
        if (kind, arch) != (e["kind"], e["architecture"]):
            raise PackError(f"{path}: {e['file']} is listed as {e['kind']}/{e['architecture']}")
    for s in manifest.get("sboms", []) + manifest.get("templates", []):
        if sha256_hex(dist / s["file"]) != s["sha256"]:
            raise PackError(f"{dist / s['file']}: sha256 is not the manifest's")
    for p in manifest.get("packages", []):
        f = dist / p["file"]
        if not f.is_file() or sha256_hex(f) != p["sha256"]:
            raise PackError(f"{f}: missing, or its sha256 is not the manifest's; refusing a package that is not the sealed one")
    return manifest


# --- SBOM --------------------------------------------------------------------------------------

def lock_checksums(root: Path) -> dict[tuple[str, str], str]:
    lock = tomllib.loads((root / "Cargo.lock").read_text())
    return {(p["name"], p["version"]): p["checksum"] for p in lock.get("package", []) if "checksum" in p}


def cargo_tree(root: Path, package: str, triple: str) -> list[tuple[str, str, str, str]]:
    """(name, version, license, repository) of everything compiled into `package` for `triple`."""
    out = subprocess.run(
        ["cargo", "tree", "--locked", "-p", package, "--target", triple, "-e", "normal",
         "--prefix", "none", "--no-dedupe", "--format", "{p}\t{l}\t{r}"],
        cwd=root, check=True, capture_output=True, text=True).stdout
    rows = set()
    for line in out.splitlines():
        if not line.strip():
            continue
        p, lic, repo = (line.split("\t") + ["", ""])[:3]
        # "{p}" is "name vX.Y.Z" with " (path)" or " (*)" after it for some; keep name and version.
        m = re.match(r"(\S+) v(\S+)", p)
        if not m:
            raise PackError(f"cargo tree: cannot read the line {line!r}")
        rows.add((m.group(1), m.group(2), lic.strip(), repo.strip()))
    return sorted(rows)


def sbom(root: Path, package: str, triple: str, version: str, commit: str, timestamp: str) -> dict:
    sums = lock_checksums(root)
    components = []
    for name, ver, lic, repo in cargo_tree(root, package, triple):
        if name == package:
            continue
        c = {
            "type": "library",
            "bom-ref": f"pkg:cargo/{name}@{ver}",
            "name": name,
            "version": ver,
            "purl": f"pkg:cargo/{name}@{ver}",
        }
        if lic:
            c["licenses"] = [{"expression": lic}]
        if (name, ver) in sums:
            c["hashes"] = [{"alg": "SHA-256", "content": sums[(name, ver)]}]
        if repo:
            c["externalReferences"] = [{"type": "vcs", "url": repo}]
        components.append(c)
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "timestamp": timestamp,
            "component": {
                "type": "application",
                "bom-ref": f"pkg:cargo/{package}@{version}",
                "name": package,
                "version": version,
                "purl": f"pkg:cargo/{package}@{version}",
                "properties": [
                    {"name": "flightlock:commit", "value": commit},
                    {"name": "cargo:target", "value": triple},
                ],
            },
        },
        "components": components,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="release/pack.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("layer")
    p.add_argument("--extension", type=Path, required=True)
    p.add_argument("--wrapper", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("clients")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--into", type=Path, help="a layer directory to lay the clients out in")
    g.add_argument("--list", action="store_true", help="print the clients' names in the layer")
    p = sub.add_parser("function")
    p.add_argument("--bootstrap", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("sbom")
    p.add_argument("--package", required=True)
    p.add_argument("--triple", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--timestamp", required=True, help="RFC 3339, the commit's time")
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("seal")
    p.add_argument("--dist", type=Path, required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--dirty", action="store_true", help="built from a checkout with uncommitted changes")
    p = sub.add_parser("verify")
    p.add_argument("--dist", type=Path, required=True)
    a = ap.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    try:
        if a.cmd == "layer":
            layer_zip(a.extension, a.wrapper, a.out, root)
        elif a.cmd == "clients" and a.into:
            copy_clients(a.into, root)
        elif a.cmd == "clients":
            print("\n".join(name for name, _ in client_files(root)))
        elif a.cmd == "function":
            function_zip(a.bootstrap, a.out)
        elif a.cmd == "sbom":
            doc = sbom(root, a.package, a.triple, a.version, a.commit, a.timestamp)
            a.out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        elif a.cmd == "seal":
            m = seal(a.dist, a.version, a.commit, a.dirty)
            for e in m["zips"]:
                print(f"{e['file']}: {e['size']} bytes (limit {e['size_limit']}), sha256 {e['sha256']}")
        elif a.cmd == "verify":
            m = load_verified(a.dist)
            print(f"{a.dist}: flightlock {m['version']} ({m['commit'][:12]}), {len(m['zips'])} zips match the manifest")
    except PackError as e:
        print(f"release/pack.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
