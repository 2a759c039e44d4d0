"""Fake sealed releases for the release tests (pytest's and release/tests/deploy_on_moto.py's)."""
from __future__ import annotations

from pathlib import Path

import pack

ROOT = Path(__file__).resolve().parents[2]


def fake_release(dist: Path, version: str = "0.1.0", salt: bytes = b"", arches=pack.ARCHES) -> dict:
    """A sealed release of small fake binaries, packed and sealed by release/pack.py itself."""
    dist.mkdir(parents=True, exist_ok=True)
    src = dist.parent / f"src-{dist.name}"
    src.mkdir(exist_ok=True)
    wrapper = ROOT / "extension/layer/flightlock-wrapper"
    for arch in arches:
        ext = src / f"ext-{arch}"
        ext.write_bytes(b"\x7fELF fake extension " + arch.encode() + salt)
        boot = src / f"boot-{arch}"
        boot.write_bytes(b"\x7fELF fake cleanup " + arch.encode() + salt)
        pack.layer_zip(ext, wrapper, dist / f"flightlock-layer-{arch}.zip")
        pack.function_zip(boot, dist / f"flightlock-cleanup-{arch}.zip")
    return pack.seal(dist, version, "0123456789abcdef0123456789abcdef01234567")
