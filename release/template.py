#!/usr/bin/env python3
"""release/template.py — the release's packaged template, generated from template.yaml.

    python3 release/template.py --dist dist/ --version 0.1.0 --commit <sha> [--source template.yaml]

writes dist/template.yaml: template.yaml's deployable parts (the layer, the lock table, the
cleanup function, the SSM parameters, the lock-user policy, the alarms, the dashboard; not the
example jobs) with their code taken from the release's zips beside it, so that

    cd dist && sam deploy --resolve-s3 --stack-name flightlock --capabilities CAPABILITY_IAM CAPABILITY_AUTO_EXPAND

(or `aws cloudformation package` + `aws cloudformation deploy`) deploys it with no build. What
changes, and nothing else (release/tests/test_template.py checks every other resource, property,
parameter, condition and output against template.yaml):

- the example jobs (resources whose Condition is CreateExampleJobs) and what only they use
  (parameters, conditions) are left out;
- each layer's ContentUri is flightlock-layer-<arch>.zip, its build metadata dropped;
- the cleanup function is one function per architecture, CleanupFunction (arm64) and
  CleanupFunctionX86, each with its zip (flightlock-cleanup-<arch>.zip) and the condition
  "table part and FunctionArchitecture = its architecture": a zip holds one architecture's
  binary, and `package` uploads a literal path only. References to it (the output
  CleanupFunctionName) pick the one that exists;
- the description names the release.

Beside it, dist/sar.yaml: the same as a Serverless Application Repository application (`sar`
below says what SAR makes differ), with LICENSE and README.md (the deploy page) that its
metadata names.

It refuses a version that is not template.yaml's Release mapping (the versioned SSM parameters
carry that version) and a dist/ that lacks a zip the template names. scripts/release runs it
before sealing, so manifest.json and SHA256SUMS cover the template too.
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
#: The packaged template's file name in dist/ (sealed with the zips by release/pack.py).
PACKAGED = "template.yaml"
#: The same as a Serverless Application Repository application (see `sar`), and its readme.
SAR = "sar.yaml"
SAR_README = "docs/src/getting-started/deploy.md"
EXAMPLE_CONDITION = "CreateExampleJobs"
CLEANUP = "CleanupFunction"
#: The packaged cleanup function per architecture: (logical id, condition).
CLEANUP_BY_ARCH = {"arm64": ("CleanupFunction", "DeployCleanupArm64"),
                   "x86_64": ("CleanupFunctionX86", "DeployCleanupX86")}


class TemplateError(Exception):
    """template.yaml or dist/ is not what a packaged template can be made from."""


# CloudFormation's short-form tags (!Ref, !Sub, ...) as their long forms, so the template is plain
# data; the output is written in the long forms, which every CloudFormation reader accepts.
class CfnLoader(yaml.SafeLoader):
    pass


def _tag(loader: CfnLoader, suffix: str, node: yaml.Node) -> dict:
    name = "Ref" if suffix == "Ref" else ("Condition" if suffix == "Condition" else f"Fn::{suffix}")
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
        if suffix == "GetAtt":
            value = value.split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {name: value}


CfnLoader.add_multi_constructor("!", _tag)


def load(path: Path) -> dict:
    # Plain dicts in the file's order, whatever mapping type a library registered on SafeLoader
    # (serverlessrepo registers OrderedDict, which safe_dump refuses).
    return json.loads(json.dumps(yaml.load(path.read_text(), Loader=CfnLoader)))


def dump(template: dict) -> str:
    return yaml.safe_dump(json.loads(json.dumps(template)), sort_keys=False, width=100, allow_unicode=True)


def references(node: Any) -> set[str]:
    """Every name a node refers to: Ref, GetAtt, Condition, ${...} in Sub, FindInMap's map."""
    out: set[str] = set()
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("Ref", "Condition") and isinstance(v, str):
                out.add(v)
            elif k == "Fn::GetAtt":
                out.add(v[0] if isinstance(v, list) else v.split(".")[0])
            elif k == "Fn::Sub":
                text = v if isinstance(v, str) else v[0]
                out |= {m.split(".")[0] for m in re.findall(r"\$\{([^}!]+)\}", text)}
                if not isinstance(v, str):
                    out -= set(v[1])
            elif k == "Fn::FindInMap":
                out.add(v[0])
            elif k == "Fn::If":
                out.add(v[0])
            out |= references(v)
    elif isinstance(node, list):
        for v in node:
            out |= references(v)
    return out


def release_version(template: dict) -> str:
    try:
        return str(template["Mappings"]["Release"]["flightlock"]["Version"])
    except KeyError as e:
        raise TemplateError(f"template.yaml has no Mappings.Release.flightlock.Version ({e})") from e


def package(source: dict, version: str, commit: str) -> dict:
    """The packaged template: `source` (template.yaml, loaded) as a release deploys it."""
    if release_version(source) != version:
        raise TemplateError(f"template.yaml's Release version is {release_version(source)}, the release's "
                            f"manifest says {version}: bump Mappings.Release.flightlock.Version with the crates")
    t = copy.deepcopy(source)
    resources = t["Resources"]
    for name in [n for n, r in resources.items() if r.get("Condition") == EXAMPLE_CONDITION]:
        del resources[name]
    for name, r in resources.items():
        if r["Type"] == "AWS::Serverless::LayerVersion":
            arches = r["Properties"]["CompatibleArchitectures"]
            if len(arches) != 1:
                raise TemplateError(f"{name}: one architecture per layer version, got {arches}")
            r["Properties"]["ContentUri"] = f"flightlock-layer-{arches[0]}.zip"
            r.pop("Metadata", None)
        elif r["Type"] == "AWS::Serverless::Function" and name != CLEANUP:
            raise TemplateError(f"{name}: a function the packaged template does not know how to package")
    cleanup = resources.pop(CLEANUP)
    if cleanup["Properties"]["Architectures"] != [{"Ref": "FunctionArchitecture"}]:
        raise TemplateError(f"{CLEANUP}: Architectures is not [!Ref FunctionArchitecture]")
    for arch, (name, cond) in CLEANUP_BY_ARCH.items():
        r = copy.deepcopy(cleanup)
        r.pop("Metadata", None)
        r["Condition"] = cond
        r["Properties"]["CodeUri"] = f"flightlock-cleanup-{arch}.zip"
        r["Properties"]["Architectures"] = [arch]
        resources[name] = r
        t["Conditions"][cond] = {"Fn::And": [{"Condition": cleanup["Condition"]},
                                             {"Fn::Equals": [{"Ref": "FunctionArchitecture"}, arch]}]}
    cleanups = {name for name, _ in CLEANUP_BY_ARCH.values()}
    for section in ("Resources", "Outputs"):
        for name, r in t.get(section, {}).items():
            if name not in cleanups and CLEANUP in references(r):
                t[section][name] = _pick_cleanup(r)
    # What only the example jobs used.
    while True:
        used = references({k: v for k, v in t.items() if k not in ("Parameters", "Conditions")})
        used |= references(t.get("Conditions", {}))
        unused_conditions = [c for c in t["Conditions"] if c not in used]
        unused_params = [p for p in t["Parameters"] if p not in used]
        if not unused_conditions and not unused_params:
            break
        for c in unused_conditions:
            del t["Conditions"][c]
        for p in unused_params:
            del t["Parameters"][p]
    t["Description"] = (
        f"flightlock {version} (commit {commit[:12]}), the release's packaged template: the extension "
        "layer (x86_64 and arm64, versions retained) and its SSM parameters "
        "<ParameterPrefix>/layer/<arch>/<version> and .../latest; the lock table (kept on removal by "
        "default) and its SSM parameters; the cleanup function; the lock-user policy; the alarms and "
        "the dashboard. Parameter Deploy picks the parts: all, layer or table. Generated from "
        "template.yaml by release/template.py; deploy it from the release's directory "
        "(docs/src/getting-started/deploy.md).")
    return t


def sar(packaged: dict, version: str) -> dict:
    """The packaged template as a Serverless Application Repository application (`sam publish`).

    SAR accepts no transform but AWS::Serverless-2016-10-31 (its CreateApplication refuses the
    list with AWS::LanguageExtensions: aws/aws-sam-cli#7231), and without that transform no
    `DeletionPolicy` can come from a parameter. So the table and its parameters are always
    kept (Retain, with deletion protection): TableDeletionPolicy=Delete is for throw-away
    stacks, which SAR users do not deploy. Everything else is the packaged template.
    """
    t = copy.deepcopy(packaged)
    if t["Transform"] != ["AWS::LanguageExtensions", "AWS::Serverless-2016-10-31"]:
        raise TemplateError(f"the packaged template's Transform is {t['Transform']}")
    t["Transform"] = "AWS::Serverless-2016-10-31"
    for name, r in t["Resources"].items():
        for policy in ("DeletionPolicy", "UpdateReplacePolicy"):
            if r.get(policy) == {"Ref": "TableDeletionPolicy"}:
                r[policy] = "Retain"
            elif isinstance(r.get(policy), dict):
                raise TemplateError(f"{name}: {policy} {r[policy]} needs AWS::LanguageExtensions")
    t = _fold_condition(t, "RetainTable", True)
    del t["Parameters"]["TableDeletionPolicy"]
    if "TableDeletionPolicy" in references(t):
        raise TemplateError("the SAR template still refers to TableDeletionPolicy")
    t["Metadata"] = {"AWS::ServerlessRepo::Application": {
        "Name": "flightlock",
        "Description": ("flightlock: single-flight Lambda functions through a FIFO, fenced DynamoDB "
                        "lock. The extension layer (x86_64, arm64), the lock table, the cleanup "
                        "function, SSM parameters, the lock-user policy and alarms."),
        "Author": "flightlock-developers",
        "SpdxLicenseId": "Apache-2.0",
        "LicenseUrl": "LICENSE",
        "ReadmeUrl": "README.md",
        "Labels": ["lambda", "layer", "extension", "dynamodb", "lock", "single-flight"],
        "HomePageUrl": "https://github.com/flightlock/flightlock",
        "SemanticVersion": version,
        "SourceCodeUrl": f"https://github.com/flightlock/flightlock/tree/v{version}",
    }}
    t["Description"] = t["Description"].replace("the release's packaged template", "the SAR application")
    return t


def _fold_condition(t: dict, name: str, value: bool) -> dict:
    """`t` with condition `name` taken as `value` in every Fn::If, and the condition removed."""
    def fold(node: Any) -> Any:
        if isinstance(node, dict):
            if list(node) == ["Fn::If"] and node["Fn::If"][0] == name:
                return fold(node["Fn::If"][1 if value else 2])
            if node.get("Condition") == name and "Type" in node:
                raise TemplateError(f"a resource with condition {name}")
            return {k: fold(v) for k, v in node.items()}
        if isinstance(node, list):
            return [fold(v) for v in node]
        return node
    t = fold(t)
    del t["Conditions"][name]
    return t


def _pick_cleanup(node: Any) -> Any:
    """`node` with each reference to the cleanup function made the one that exists."""
    if isinstance(node, dict):
        if node == {"Ref": CLEANUP}:
            arm, arm_cond = CLEANUP_BY_ARCH["arm64"]
            x86, _ = CLEANUP_BY_ARCH["x86_64"]
            return {"Fn::If": [arm_cond, {"Ref": arm}, {"Ref": x86}]}
        if ("Fn::GetAtt" in node or "Fn::Sub" in node) and CLEANUP in references(node):
            raise TemplateError(f"a reference to {CLEANUP} the generator does not rewrite: {node}")
        return {k: _pick_cleanup(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_pick_cleanup(v) for v in node]
    return node


def code_paths(t: dict) -> list[str]:
    return [p for r in t["Resources"].values() for k, p in r.get("Properties", {}).items()
            if k in ("CodeUri", "ContentUri")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dist", type=Path, required=True, help="the release's directory (its zips)")
    ap.add_argument("--version", required=True, help="the release's version (the crates')")
    ap.add_argument("--commit", required=True, help="the release's commit")
    ap.add_argument("--source", type=Path, default=ROOT / "template.yaml")
    args = ap.parse_args(argv)
    try:
        t = package(load(args.source), args.version, args.commit)
        missing = [p for p in code_paths(t) if not (args.dist / p).is_file()]
        if missing:
            raise TemplateError(f"{args.dist} lacks {', '.join(missing)}: the packaged template deploys "
                                "both architectures (scripts/release without --arch)")
    except (OSError, KeyError, ValueError, yaml.YAMLError, TemplateError) as e:
        print(f"template: error: {e}", file=sys.stderr)
        return 1
    header = f"# flightlock {args.version}: generated from template.yaml by release/template.py; do not edit.\n"
    try:
        app = sar(t, args.version)
    except TemplateError as e:
        print(f"template: error: {e}", file=sys.stderr)
        return 1
    (args.dist / PACKAGED).write_text(header + dump(t))
    # The SAR application and the two files its metadata names (`sam package` uploads them).
    (args.dist / SAR).write_text(header + dump(app))
    (args.dist / "LICENSE").write_bytes((ROOT / "LICENSE").read_bytes())
    (args.dist / "README.md").write_bytes((ROOT / SAR_README).read_bytes())
    print(f"template: wrote {args.dist / PACKAGED} and {args.dist / SAR}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
