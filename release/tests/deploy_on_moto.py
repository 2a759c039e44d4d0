#!/usr/bin/env python3
"""release/tests/deploy_on_moto.py — a release deployed as a user would, with no toolchain, on
moto's CloudFormation (scripts/check-upgrade runs it with the SAM CLI's venv).

 1. Two fake releases (0.1.0 = template.yaml's version, and the next one, 0.2.0, from a copy of
    template.yaml with that version), packed and sealed by release/pack.py and given their
    packaged template by release/template.py, as scripts/release does.
 2. With a PATH that holds only `sam` (no cargo, rustc, zig or make; checked), `sam package`
    uploads the release's zips to moto's S3, as `sam deploy --resolve-s3` does; the result,
    transformed as CloudFormation would (tests/template/rollout_on_moto.py's cfn_template),
    deploys as stack `flightlock`: the layer (its CodeSha256 the manifest's), the table, the
    cleanup function (its CodeSha256 the manifest's) and the SSM parameters.
 3. tests/template/consumer.yaml attaches the layer pinned by version through SSM
    ({{resolve:ssm:/flightlock/layer/x86_64/0.1.0}}).
 4. The update to the next release keeps both layer versions and both versioned parameters, and
    the same table; the consumer runs 0.1.0 until its own template names 0.2.0.
 5. A Deploy flip (all -> layer -> all) keeps the table, and the flip back is refused on
    <prefix>/table/stack; no second table exists.

usage: deploy_on_moto.py [TEMPLATE] [--dist DIR]   (default: template.yaml, fake releases)

With --dist, the first release is a real one: DIR is a sealed dist/ that scripts/release built
(scripts/check-release passes the one its dry run of the release workflow built), its layer and
cleanup zips the compiled ones; the next release is still a fake one made from the template.

moto's server runs with release/tests/moto_cloudformation.py's corrections (each one a rule
CloudFormation documents: layer ARNs, retention, replacement, ordering, SSM references).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3
from botocore.exceptions import ClientError

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "release"), str(ROOT / "release/tests"), str(ROOT / "tests/template")]

import pack  # noqa: E402
import template  # noqa: E402
from fakes import fake_release  # noqa: E402
from with_moto import aws_environment, start_moto  # noqa: E402

REGION = "us-east-1"
BUCKET = "flightlock-release-deploy"
TOOLCHAIN = ("cargo", "rustc", "zig", "make", "cargo-lambda")
# The template the releases are made from: template.yaml, or a copy given as the argument (a
# deliberately broken one, to see a check fail); and a real release's dist/, if given.
ARGS = argparse.ArgumentParser(prog="deploy_on_moto.py")
ARGS.add_argument("template", nargs="?", type=Path, default=ROOT / "template.yaml")
ARGS.add_argument("--dist", type=Path, help="a sealed dist/ of scripts/release, deployed as the first release")
OPTIONS = ARGS.parse_args()
SOURCE = OPTIONS.template.resolve()


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)
    print(f"deploy-on-moto: ok: {what}", flush=True)


def release(scratch: Path, version: str, salt: bytes) -> Path:
    """A sealed fake release with its packaged template, as scripts/release makes one."""
    dist = scratch / f"dist-{version}"
    source = scratch / f"template-{version}.yaml"
    text = SOURCE.read_text()
    current = template.release_version(template.load(SOURCE))
    source.write_text(text.replace(f"      Version: {current}\n", f"      Version: {version}\n", 1))
    fake_release(dist, version, salt)
    rc = template.main(["--dist", str(dist), "--version", version, "--commit", "0" * 40,
                        "--source", str(source)])
    assert rc == 0, f"release/template.py failed for {version}"
    pack.seal(dist, version, "0" * 40)
    pack.load_verified(dist)
    return dist


def no_toolchain_path(scratch: Path) -> str:
    """A PATH with only the SAM CLI on it."""
    bin_dir = scratch / "bin"
    bin_dir.mkdir()
    sam = Path(os.environ["FLIGHTLOCK_PY_BIN"]) / "sam"
    (bin_dir / "sam").symlink_to(sam)
    path = str(bin_dir)
    found = [t for t in TOOLCHAIN if shutil.which(t, path=path)]
    check(not found, f"the deploy PATH holds no {', '.join(TOOLCHAIN)} ({path})")
    return path


def sam_package(dist: Path, path: str, out: Path) -> dict[str, str]:
    """`sam package` of the release's template, from its directory; the code locations it wrote."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARGO", "RUSTUP"))}
    env.update(PATH=path, SAM_CLI_TELEMETRY="0", HOME=str(out.parent))
    run = subprocess.run(["sam", "package", "--template-file", "template.yaml", "--s3-bucket", BUCKET,
                          "--output-template-file", str(out), "--region", REGION],
                         cwd=dist, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"sam package failed:\n{run.stdout}\n{run.stderr}"
    from samcli.yamlhelper import yaml_parse
    t = yaml_parse(out.read_text())
    return {name: r["Properties"].get("CodeUri") or r["Properties"].get("ContentUri")
            for name, r in t["Resources"].items()
            if "CodeUri" in r.get("Properties", {}) or "ContentUri" in r.get("Properties", {})}


def main() -> int:
    scratch = Path(tempfile.mkdtemp(prefix="flightlock-deploy-"))
    moto, url = start_moto(scratch)
    try:
        code = run(scratch, url)
    except Exception:
        log = [line for line in (scratch / "moto.log").read_text().splitlines() if "HTTP/1.1\" " not in line]
        print("deploy-on-moto: the end of moto's log:\n" + "\n".join(log[-40:]), file=sys.stderr)
        print(f"deploy-on-moto: its files are kept in {scratch}", file=sys.stderr)
        raise
    finally:
        moto.terminate()
        moto.wait(10)
    shutil.rmtree(scratch, ignore_errors=True)
    return code


def run(scratch: Path, url: str) -> int:
    env = aws_environment(url)
    os.environ.clear()
    os.environ.update(env)
    import rollout_on_moto as rollout  # after AWS_ENDPOINT_URL: its clients are made per call

    cfn, s3, ssm, lam, ddb = (boto3.client(s, region_name=REGION)
                              for s in ("cloudformation", "s3", "ssm", "lambda", "dynamodb"))
    s3.create_bucket(Bucket=BUCKET)
    rollout.BUCKET = BUCKET
    v1, v2 = template.release_version(template.load(SOURCE)), "0.2.0"
    check(v1 != v2, f"the next release differs from template.yaml's ({v1})")
    if OPTIONS.dist:
        real = pack.load_verified(OPTIONS.dist.resolve())
        check(real["version"] == v1 and not real.get("dirty"),
              f"{OPTIONS.dist} is a sealed release of {v1}, built from a commit ({real['commit'][:12]})")
        first = OPTIONS.dist.resolve()
    else:
        first = release(scratch, v1, b"")
    dists = {v1: first, v2: release(scratch, v2, b" next")}
    path = no_toolchain_path(scratch)

    def body(version: str, params: dict[str, str]) -> dict:
        out = scratch / f"packaged-{version}.yaml"
        uris = sam_package(dists[version], path, out)
        t = rollout.cfn_template(out, uris, params)
        (scratch / f"stack-{version}-{params.get('Deploy', 'all')}.json").write_text(json.dumps(t, indent=1))
        return t

    def manifest_sha(version: str, file: str) -> str:
        m = json.loads((dists[version] / "manifest.json").read_text())
        return next(z["code_sha256"] for z in m["zips"] if z["file"] == file)

    def value(name: str) -> str:
        return ssm.get_parameter(Name=name)["Parameter"]["Value"]

    def layer_sha(arn: str) -> str:
        name, number = arn.split(":")[-2:]
        return lam.get_layer_version(LayerName=name, VersionNumber=int(number))["Content"]["CodeSha256"]

    # 2. The release deployed from its directory with the SAM CLI alone (timed: the part of a
    # user's first deploy that runs on their machine; CloudFormation's own minutes are AWS's).
    params: dict[str, str] = {}
    started = time.monotonic()
    out1 = rollout.outputs(rollout.deploy(cfn, "flightlock", body(v1, params), params))
    print(f"deploy-on-moto: release {v1} packaged and deployed in {time.monotonic() - started:.1f}s "
          f"({'the real release ' + str(first) if OPTIONS.dist else 'a fake release'})", flush=True)
    x86_1, arm_1 = out1["FlightlockLayerX86Arn"], out1["FlightlockLayerArm64Arn"]
    check(bool(rollout.ARN.match(x86_1)), f"the layer version ARN {x86_1}")
    check(layer_sha(x86_1) == manifest_sha(v1, "flightlock-layer-x86_64.zip")
          and layer_sha(arm_1) == manifest_sha(v1, "flightlock-layer-arm64.zip"),
          "both layer versions hold the release's zips (CodeSha256 = the manifest's)")
    cleanup = lam.get_function(FunctionName=out1["CleanupFunctionName"])["Configuration"]
    check(cleanup["Architectures"] == ["arm64"]
          and cleanup["CodeSha256"] == manifest_sha(v1, "flightlock-cleanup-arm64.zip"),
          "the cleanup function runs the release's arm64 zip (FunctionArchitecture's default)")
    table = out1["LockTableName"]
    check(ddb.list_tables()["TableNames"] == [table], f"one lock table, {table}")
    want = {f"/flightlock/layer/x86_64/{v1}": x86_1, "/flightlock/layer/x86_64/latest": x86_1,
            f"/flightlock/layer/arm64/{v1}": arm_1, "/flightlock/layer/arm64/latest": arm_1,
            "/flightlock/table/name": table, "/flightlock/table/lock-user-policy": out1["LockUserPolicyArn"]}
    check(all(value(k) == v for k, v in want.items()), f"the SSM parameters: {sorted(want)}")
    check(value("/flightlock/table/stack").startswith("arn:aws:cloudformation:"),
          "/flightlock/table/stack names the creating stack")

    # 3. A consumer pinned to v1 by name.
    consumer_text = (ROOT / "tests/template/consumer.yaml").read_text()
    pin = f"{{{{resolve:ssm:/flightlock/layer/x86_64/{v1}}}}}"
    check(pin in consumer_text, f"tests/template/consumer.yaml pins {pin}")
    code = rollout.upload(s3, "consumer.zip", rollout.fake_zip("def handler(e, c): return {}"))

    def consumer(version: str, latest_version: int) -> dict:
        text = consumer_text.replace(pin, f"{{{{resolve:ssm:/flightlock/layer/x86_64/{version}}}}}")
        # Its other pinned form, latest:N (SSM's own history), at the version that exists now.
        text = re.sub(r"(\{\{resolve:ssm:/flightlock/layer/arm64/latest):\d+\}\}", rf"\1:{latest_version}}}}}", text)
        p = scratch / f"consumer-{version}.yaml"
        p.write_text(text)
        return rollout.cfn_template(p, {"NightlyReport": code, "QueueWorker": code}, {})

    rollout.deploy(cfn, "consumer", consumer(v1, 1), {})
    check(rollout.function_layers(lam, cfn, "consumer", "NightlyReport") == [x86_1],
          f"the consumer's NightlyReport runs {x86_1}, resolved from /flightlock/layer/x86_64/{v1}")

    # 4. The next release.
    out2 = rollout.outputs(rollout.deploy(cfn, "flightlock", body(v2, params), params, update=True))
    x86_2 = out2["FlightlockLayerX86Arn"]
    check(x86_2 != x86_1 and layer_sha(x86_2) == manifest_sha(v2, "flightlock-layer-x86_64.zip"),
          f"release {v2} published a new layer version, {x86_2}")
    check(layer_sha(x86_1) == manifest_sha(v1, "flightlock-layer-x86_64.zip"), f"{x86_1} is still there")
    check(value(f"/flightlock/layer/x86_64/{v1}") == x86_1 and value(f"/flightlock/layer/x86_64/{v2}") == x86_2,
          f"/flightlock/layer/x86_64/{v1} kept, /flightlock/layer/x86_64/{v2} added")
    latest = ssm.get_parameter(Name="/flightlock/layer/x86_64/latest")["Parameter"]
    check((latest["Value"], latest["Version"]) == (x86_2, 2), "/flightlock/layer/x86_64/latest moved (its version 2)")
    check(out2["LockTableName"] == table and ddb.list_tables()["TableNames"] == [table]
          and value("/flightlock/table/name") == table, f"the same table, {table}")
    check(rollout.function_layers(lam, cfn, "consumer", "NightlyReport") == [x86_1],
          f"the consumer still runs {v1} until its stack moves")
    rollout.deploy(cfn, "consumer", consumer(v2, 2), {}, update=True)
    check(rollout.function_layers(lam, cfn, "consumer", "NightlyReport") == [x86_2],
          f"pinned to {v2} in its template, the consumer moved")

    # 5. Deploy all -> layer -> all.
    layer_only = {"Deploy": "layer"}
    rollout.deploy(cfn, "flightlock", body(v2, layer_only), layer_only, update=True)
    check(ddb.list_tables()["TableNames"] == [table] and value("/flightlock/table/name") == table,
          f"Deploy=layer: the table is kept ({table}), and /flightlock/table/name still names it")
    all_again = {"Deploy": "all"}
    try:
        rollout.deploy(cfn, "flightlock", body(v2, all_again), all_again, update=True)
        refused = None
    except (ClientError, rollout.Unsupported) as e:
        refused = str(e)
    check(refused is not None and "/flightlock/table/stack" in refused,
          f"Deploy=all again is refused on /flightlock/table/stack: {refused and refused[:200]}")
    check(ddb.list_tables()["TableNames"] == [table] and value("/flightlock/table/name") == table,
          f"after the refusal: still one table, {table}")
    print("deploy-on-moto: a release deployed, attached by version, upgraded and flipped with no toolchain",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
