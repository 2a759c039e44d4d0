#!/usr/bin/env python3
"""tests/template/rollout_on_moto.py — the upgrade guide's two-version rollout, on moto's server.

Run by scripts/check-upgrade through release/tests/with_moto.py (moto's server on 127.0.0.1 with
the CloudFormation corrections of release/tests/moto_cloudformation.py, AWS_ENDPOINT_URL set), with
the SAM CLI's venv (samtranslator, boto3). Steps:

 1. template.yaml, transformed here as CloudFormation would (AWS::LanguageExtensions' one use, the
    DeletionPolicy, resolved; then the SAM transform, with samtranslator), with fake artifacts in
    moto's S3, deployed as stack `flightlock` (Deploy=all): the SSM parameters hold the layer
    version ARNs and the table's name, and no export is a layer ARN.
 2. tests/template/consumer.yaml (the docs' attach forms), its pinned reference at parameter
    version 1, deployed as stack `consumer`: its functions carry the layer version of step 1.
 3. The `flightlock` stack updated with a rebuilt layer (release 2): the parameters move to the
    new layer version (parameter version 2), the old layer version is still there (retained),
    and the update is not blocked by the consumer stack; the layer versions carry
    DeletionPolicy: Retain once transformed.
 4. The consumer's reference pinned to version 2 and deployed: its function moves; the
    unpinned references still hold version 1 (CloudFormation re-reads a reference only when it
    changes, which is why the guide pins).
 5. Each part alone (Deploy=layer, Deploy=table) deploys as its own stack.

Where moto's CloudFormation lacks something, the step says exactly what it refused and exits 2
(scripts/check-upgrade reports that as a limit of the emulator, not a pass).
"""
from __future__ import annotations

import copy
import json
import os
import re
import sys
import time
from pathlib import Path

import boto3
from samcli.yamlhelper import yaml_parse
from samtranslator.translator.transform import transform

ROOT = Path(__file__).resolve().parents[2]
REGION = os.environ.get("AWS_REGION", "us-east-1")
BUCKET = "flightlock-rollout"


class Unsupported(Exception):
    """moto's server does not emulate what a step needs."""


def clients():
    return {s: boto3.client(s, region_name=REGION) for s in ("cloudformation", "s3", "ssm", "lambda")}


def upload(s3, key: str, data: bytes) -> str:
    s3.put_object(Bucket=BUCKET, Key=key, Body=data)
    return f"s3://{BUCKET}/{key}"


def fake_zip(text: str) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("flightlock-wrapper", text)
    return buf.getvalue()


class Loader:
    """samtranslator's managed-policy loader: no AWS managed policy names are looked up."""

    def load(self):
        return {}


def cfn_template(path: Path, uris: dict[str, str], params: dict[str, str]) -> dict:
    """The template as CloudFormation deploys it: LanguageExtensions' DeletionPolicy resolved,
    code locations in moto's S3, the SAM transform applied."""
    t = yaml_parse(path.read_text())
    transforms = t.get("Transform")
    if isinstance(transforms, list):
        assert transforms[0] == "AWS::LanguageExtensions", transforms
        t["Transform"] = transforms[1]
        for r in t["Resources"].values():
            for policy in ("DeletionPolicy", "UpdateReplacePolicy"):
                if isinstance(r.get(policy), dict):
                    name = r[policy]["Ref"]
                    r[policy] = params.get(name, t["Parameters"][name]["Default"])
    for name, r in t["Resources"].items():
        props = r.get("Properties", {})
        for key in ("CodeUri", "ContentUri"):
            if key in props:
                props[key] = uris[name]
    out = transform(t, params, Loader())
    # moto's UpdateStack checks Fn::GetAtt inside resources whose condition is false ("instance of
    # Fn::GetAtt references undefined resource DemoPythonJobRole" with the example jobs off),
    # which CloudFormation does not: leave out, for these parameter values, what CloudFormation
    # would not create anyway.
    defaults = {k: v.get("Default") for k, v in out.get("Parameters", {}).items()}
    values = {**defaults, **params}
    for section in ("Resources", "Outputs"):
        for name in [n for n, r in out.get(section, {}).items()
                     if "Condition" in r and not condition(out, values, r["Condition"])]:
            del out[section][name]
    return out


def condition(t: dict, values: dict, name: str) -> bool:
    """A condition of the transformed template, for these parameter values."""
    def ev(e):
        if isinstance(e, dict):
            (fn, arg), = e.items()
            if fn == "Ref":
                return values[arg]
            if fn == "Condition":
                return condition(t, values, arg)
            if fn == "Fn::Equals":
                return ev(arg[0]) == ev(arg[1])
            if fn == "Fn::Not":
                return not ev(arg[0])
            if fn == "Fn::And":
                return all(ev(a) for a in arg)
            if fn == "Fn::Or":
                return any(ev(a) for a in arg)
            raise AssertionError(f"condition function {fn}")
        return e
    return ev(t["Conditions"][name])


def wait(cfn, stack: str) -> dict:
    for _ in range(120):
        s = cfn.describe_stacks(StackName=stack)["Stacks"][0]
        if not s["StackStatus"].endswith("_IN_PROGRESS"):
            if s["StackStatus"] not in ("CREATE_COMPLETE", "UPDATE_COMPLETE"):
                events = cfn.describe_stack_events(StackName=stack)["StackEvents"]
                failed = [f"{e['LogicalResourceId']}: {e.get('ResourceStatusReason')}" for e in events
                          if "FAILED" in e["ResourceStatus"]]
                raise Unsupported(f"stack {stack}: {s['StackStatus']} {s.get('StackStatusReason')} {failed}")
            return s
        time.sleep(0.2)
    raise AssertionError(f"stack {stack} did not finish")


def deploy(cfn, stack: str, body: dict, params: dict[str, str], update: bool = False) -> dict:
    args = dict(StackName=stack, TemplateBody=json.dumps(body),
                Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in params.items()],
                Capabilities=["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"])
    (cfn.update_stack if update else cfn.create_stack)(**args)
    return wait(cfn, stack)


def outputs(stack: dict) -> dict[str, str]:
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def param(ssm, name: str) -> tuple[str, int]:
    p = ssm.get_parameter(Name=name)["Parameter"]
    return p["Value"], p["Version"]


def function_layers(lam, cfn, stack: str, logical: str) -> list[str]:
    physical = cfn.describe_stack_resource(StackName=stack, LogicalResourceId=logical)[
        "StackResourceDetail"]["PhysicalResourceId"]
    return [layer["Arn"] for layer in lam.get_function(FunctionName=physical)["Configuration"].get("Layers", [])]


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)
    print(f"rollout: ok: {what}", flush=True)


ARN = re.compile(r"arn:aws:lambda:[a-z0-9-]+:\d{12}:layer:[A-Za-z0-9_-]+:\d+$")
LIMITS: list[str] = []


def limit(what: str) -> None:
    """A step moto's server cannot run: said, counted, and not a pass of that step."""
    LIMITS.append(what)
    print(f"rollout: LIMIT of moto's server: {what}", flush=True)


def parameter_names(ssm, path: str) -> set[str]:
    pages = ssm.get_paginator("describe_parameters").paginate(
        ParameterFilters=[{"Key": "Path", "Option": "Recursive", "Values": [path]}])
    return {p["Name"] for page in pages for p in page["Parameters"]}


def layer_arns(lam) -> set[str]:
    return {v["LayerVersionArn"] for layer in lam.list_layers()["Layers"]
            for v in lam.list_layer_versions(LayerName=layer["LayerName"])["LayerVersions"]}


def main() -> int:
    c = clients()
    cfn, s3, ssm, lam = c["cloudformation"], c["s3"], c["ssm"], c["lambda"]
    s3.create_bucket(Bucket=BUCKET)
    code = upload(s3, "code.zip", fake_zip("print('stand-in')"))
    params = {"Deploy": "all", "TableDeletionPolicy": "Delete"}

    def flightlock_uris(release: int) -> dict[str, str]:
        layer = upload(s3, f"layer-{release}.zip", fake_zip(f"release {release}"))
        return {"FlightlockLayerX86": layer, "FlightlockLayerArm64": layer, "CleanupFunction": code,
                "DemoPythonJob": code, "DemoRustJob": code}

    # 1. The flightlock stack, release 1.
    body = cfn_template(ROOT / "template.yaml", flightlock_uris(1), params)
    # What keeps a layer version that a stack update replaces: SAM turns RetentionPolicy: Retain
    # into DeletionPolicy: Retain on the AWS::Lambda::LayerVersion (whose logical id changes
    # with its content). moto never deletes a layer version a stack drops (its LayerVersion has
    # no delete_from_cloudformation_json), so the update below cannot show it.
    layers = {n: r for n, r in body["Resources"].items() if r["Type"] == "AWS::Lambda::LayerVersion"}
    check(len(layers) == 2 and all(r.get("DeletionPolicy") == "Retain" for r in layers.values()),
          f"the transformed layer versions carry DeletionPolicy: Retain ({sorted(layers)})")
    limit("a layer version that a stack update drops is never deleted, whatever its DeletionPolicy "
          "(moto's LayerVersion has no delete_from_cloudformation_json): retention is checked in "
          "the transformed template above, not by the update")
    v1 = outputs(deploy(cfn, "flightlock", body, params))
    version = yaml_parse((ROOT / "template.yaml").read_text())["Mappings"]["Release"]["flightlock"]["Version"]
    check(parameter_names(ssm, "/flightlock") == {
        "/flightlock/layer/x86_64/latest", "/flightlock/layer/arm64/latest",
        f"/flightlock/layer/x86_64/{version}", f"/flightlock/layer/arm64/{version}",
        "/flightlock/table/name", "/flightlock/table/stack", "/flightlock/table/lock-user-policy"},
        "Deploy=all wrote the seven SSM parameters under /flightlock")
    check(param(ssm, "/flightlock/table/name")[0] == v1["LockTableName"],
          f"/flightlock/table/name = {v1['LockTableName']}")
    check(param(ssm, "/flightlock/table/lock-user-policy")[0] == v1["LockUserPolicyArn"],
          "/flightlock/table/lock-user-policy = the LockUserPolicyArn output")
    exports = {e["Name"] for e in cfn.list_exports()["Exports"]}
    check(exports == {f"flightlock-{o}" for o in ("LockTableName", "LockTableArn", "LockUserPolicyArn",
                                                 "CleanupFunctionName")},
          f"only values no upgrade changes are exported: {sorted(exports)}")
    x86_v1 = v1["FlightlockLayerX86Arn"]
    arns = ARN.match(x86_v1) is not None
    if arns:
        check(param(ssm, "/flightlock/layer/x86_64/latest") == (x86_v1, 1),
              f"/flightlock/layer/x86_64/latest = {x86_v1} (parameter version 1)")
    else:
        limit(f"Ref of an AWS::Lambda::LayerVersion is moto's model object, not the version ARN "
              f"(output FlightlockLayerX86Arn = {x86_v1!r}); GetParameter of "
              "/flightlock/layer/x86_64/latest, whose Value is that Ref, then fails with HTTP 500 "
              "(TypeError: Object of type LayerVersion is not JSON serializable)")
    layers_v1 = layer_arns(lam)
    check(len(layers_v1) == 2, f"two layer versions, one per architecture: {len(layers_v1)}")

    # 2. The consumer stack (the docs' attach forms; its pinned reference at version 1).
    consumer_text = (ROOT / "tests/template/consumer.yaml").read_text()
    pinned = re.search(r"\{\{resolve:ssm:([^}]+):(\d+)\}\}", consumer_text)
    assert pinned, "consumer.yaml has no pinned reference"
    scratch = ROOT / "target/rollout"
    scratch.mkdir(parents=True, exist_ok=True)

    def consumer_body(version: int) -> dict:
        path = scratch / "consumer.yaml"
        path.write_text(consumer_text.replace(pinned.group(0), f"{{{{resolve:ssm:{pinned.group(1)}:{version}}}}}"))
        return cfn_template(path, {"NightlyReport": code, "QueueWorker": code}, {})

    deploy(cfn, "consumer", consumer_body(1), {})
    got = function_layers(lam, cfn, "consumer", "NightlyReport")
    resolves = arns and got == [x86_v1]
    if resolves:
        check(True, f"consumer NightlyReport runs {x86_v1}, resolved from SSM")
    else:
        limit(f"its CloudFormation does not resolve {{{{resolve:ssm:…}}}}: the consumer deploys, but "
              f"its function NightlyReport has the layers {got}, not the parameter's value")

    # 3. Release 2 of the flightlock stack, a rebuilt layer, beside the consumer stack.
    body = cfn_template(ROOT / "template.yaml", flightlock_uris(2), params)
    v2 = outputs(deploy(cfn, "flightlock", body, params, update=True))
    check(True, "the update to release 2 completed beside the consumer stack (nothing imported)")
    layers_v2 = layer_arns(lam)
    check(len(layers_v2 - layers_v1) == 2,
          f"release 2 published a new layer version per architecture ({len(layers_v2)} in all)")
    if arns:
        check(param(ssm, "/flightlock/layer/x86_64/latest") == (v2["FlightlockLayerX86Arn"], 2),
              "/flightlock/layer/x86_64/latest moved to release 2 (parameter version 2)")
    if resolves:
        check(function_layers(lam, cfn, "consumer", "NightlyReport") == [x86_v1],
              "the consumer's functions still run release 1 until their stack moves")
        # 4. The consumer moves by pinning parameter version 2.
        deploy(cfn, "consumer", consumer_body(2), {}, update=True)
        check(function_layers(lam, cfn, "consumer", "QueueWorker") == [v2["FlightlockLayerArm64Arn"]],
              "pinned at :2, QueueWorker moved to release 2")

    # 5. Each part alone, as its own stack under its own prefix.
    for part, want in (("layer", {"layer/x86_64/latest", "layer/arm64/latest",
                                  f"layer/x86_64/{version}", f"layer/arm64/{version}"}),
                       ("table", {"table/name", "table/stack", "table/lock-user-policy"})):
        prefix = f"/flightlock-{part}"
        p = {"Deploy": part, "ParameterPrefix": prefix, "TableDeletionPolicy": "Delete"}
        before = layer_arns(lam)
        body = cfn_template(ROOT / "template.yaml", flightlock_uris(1), p)
        out = outputs(deploy(cfn, f"flightlock-{part}", body, p))
        check(parameter_names(ssm, prefix) == {f"{prefix}/{w}" for w in want},
              f"Deploy={part} wrote exactly {sorted(want)} under {prefix}; outputs {sorted(out)}")
        added = len(layer_arns(lam) - before)
        check(added == (2 if part == "layer" else 0), f"Deploy={part} published {added} layer versions")
    if LIMITS:
        print(f"rollout: every step moto's server emulates passed; {len(LIMITS)} it cannot run (above)", flush=True)
    else:
        print("rollout: the two-version rollout and both parts deployed on moto's server", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Unsupported as e:
        print(f"rollout: moto's server refused: {e}", file=sys.stderr)
        sys.exit(2)
