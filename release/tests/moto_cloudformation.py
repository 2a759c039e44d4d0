"""moto's server with its CloudFormation made to do what CloudFormation documents for the
templates flightlock deploys (started by release/tests/deploy_on_moto.py; run with moto's venv).

moto 5.1's CloudFormation differs from CloudFormation's documented behaviour in ways the
upgrade checks depend on. Each change below restores one documented rule, and none of them
decides an outcome the checks look for: they make moto apply the template as CloudFormation
would, and moto's own backends (SSM, Lambda, DynamoDB) still refuse what they refuse
(ParameterAlreadyExists, ResourceInUseException).

1. `Ref` of an AWS::Lambda::LayerVersion is the layer version's ARN, and its layer is the
   template's `LayerName` (CloudFormation reference, AWS::Lambda::LayerVersion, "Return
   values"). moto returned its Python object and named the layer after the logical id.
2. A resource removed from the template by an update is kept when its `DeletionPolicy` is
   Retain ("DeletionPolicy attribute": "when its resource is removed from the template" as well
   as on stack deletion). moto honoured it only on stack deletion.
3. An AWS::SSM::Parameter whose `Name` changes is replaced: the new one is created and the old
   one deleted, unless `UpdateReplacePolicy` is Retain ("UpdateReplacePolicy attribute"). One
   whose Name stays is updated in place: SSM keeps its history and adds a version. moto deleted
   and created it in both cases (version 1 again, the old name lost).
4. An update creates new resources in dependency order (`DependsOn`, `Ref`, `Fn::GetAtt`,
   `Fn::Sub`), as a stack creation does. moto created them in template order.
5. Dynamic references `{{resolve:ssm:NAME}}` and `{{resolve:ssm:NAME:VERSION}}` in resource
   properties are resolved when the resource is created or updated ("Get values stored in
   other services using dynamic references"); an unknown name or version fails the operation.
   moto left the text as it was.
6. An AWS::Lambda::Function created by a stack has the template's `Layers` and `Architectures`
   (CloudFormation reference, AWS::Lambda::Function). moto's stack creation dropped both (its
   update kept Layers), and its update read an inline `Code.ZipFile` (source text, which its
   creation zips) as a base64 zip and failed.

7. A stack operation that creates an AWS::SSM::Parameter whose name exists fails with
   CloudFormation's message, "Resource of type 'AWS::SSM::Parameter' with identifier 'NAME'
   already exists." moto answered SSM's own JSON error on CloudFormation's XML API (no client
   can read it) and without the name. (moto does not roll a failed update back; the checks look
   only at what CloudFormation would also leave: resources created before the failure.)

usage: python moto_cloudformation.py -p PORT
"""
from __future__ import annotations

import argparse
import base64
import copy
import re
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from moto.awslambda import models as lambda_models
from moto.cloudformation import exceptions as cfn_exceptions
from moto.cloudformation import parsing
from moto.ssm import exceptions as ssm_exceptions
from moto.ssm import models as ssm_models

ROOT = Path(__file__).resolve().parents[2]

# 1. Layer versions: Ref is the ARN; the layer is named by LayerName.
lambda_models.LayerVersion.physical_resource_id = property(lambda self: self.arn)
_create_layer = lambda_models.LayerVersion.create_from_cloudformation_json.__func__


def _create_layer_version(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
    name = cloudformation_json["Properties"].get("LayerName", resource_name)
    return _create_layer(cls, name, cloudformation_json, account_id, region_name, **kwargs)


lambda_models.LayerVersion.create_from_cloudformation_json = classmethod(_create_layer_version)


# 6. Functions: Layers and Architectures as the template says.
_create_function = lambda_models.LambdaFunction.create_from_cloudformation_json.__func__


def _create_function_with_layers(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
    fn = _create_function(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
    props = cloudformation_json["Properties"]
    fn.layers = fn._get_layers_data(props.get("Layers", []))
    fn.architectures = props.get("Architectures", ["x86_64"])
    return fn


lambda_models.LambdaFunction.create_from_cloudformation_json = classmethod(_create_function_with_layers)
_update_function = lambda_models.LambdaFunction.update_from_cloudformation_json.__func__


def _update_function_inline(cls, original_resource, new_resource_name, cloudformation_json, account_id, region_name):
    code = cloudformation_json["Properties"]["Code"]
    if "ZipFile" in code:
        zipped = base64.b64encode(cls._create_zipfile_from_plaintext_code(code["ZipFile"]))
        cloudformation_json = copy.deepcopy(cloudformation_json)
        cloudformation_json["Properties"]["Code"]["ZipFile"] = zipped.decode()
    return _update_function(cls, original_resource, new_resource_name, cloudformation_json, account_id,
                            region_name)


lambda_models.LambdaFunction.update_from_cloudformation_json = classmethod(_update_function_inline)


# 2 and 4. Updates: removed resources kept by DeletionPolicy Retain; new ones in dependency order.
def _references(node: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "Ref" and isinstance(v, str):
                out.add(v)
            elif k == "Fn::GetAtt":
                out.add(v[0] if isinstance(v, list) else v.split(".")[0])
            elif k == "Fn::Sub":
                text = v if isinstance(v, str) else v[0]
                out |= {m.split(".")[0] for m in re.findall(r"\$\{([^}!]+)\}", text)}
            out |= _references(v)
    elif isinstance(node, list):
        for v in node:
            out |= _references(v)
    return out


def _dependency_order(resources: dict[str, Any]) -> dict[str, Any]:
    deps = {}
    for name, r in resources.items():
        on = r.get("DependsOn", [])
        deps[name] = ({on} if isinstance(on, str) else set(on)) | _references(r.get("Properties", {}))
        deps[name] &= set(resources) - {name}
    ordered: dict[str, Any] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in ordered:
            return
        if name in path:
            raise ValueError(f"circular dependency: {' -> '.join(path + (name,))}")
        for d in sorted(deps[name]):
            visit(d, path + (name,))
        ordered[name] = resources[name]

    for name in resources:
        visit(name, ())
    return ordered


_update = parsing.ResourceMap.update


def _update_stack(self, template: dict[str, Any], parameters=None) -> None:
    template = dict(template, Resources=_dependency_order(template["Resources"]))
    retained = [name for name, r in self._resource_json_map.items()
                if name not in template["Resources"] and r.get("DeletionPolicy") == "Retain"]
    for name in retained:
        # Forgotten by the stack, not deleted (the resource itself stays in its backend).
        self._resource_json_map = {k: v for k, v in self._resource_json_map.items() if k != name}
        self._parsed_resources.pop(name, None)
    try:
        _update(self, template, parameters)
    except Exception:
        # moto's server answers 500 with no detail: the cause goes to its log.
        traceback.print_exc()
        raise


parsing.ResourceMap.update = _update_stack


# 3. SSM parameters: replaced (old one kept with UpdateReplacePolicy Retain) or updated in place.
def _update_parameter(cls, original_resource, new_resource_name, cloudformation_json, account_id, region_name):
    props = cloudformation_json["Properties"]
    backend = ssm_models.ssm_backends[account_id][region_name]
    if props.get("Name") == original_resource.name:
        return backend.put_parameter(
            name=props["Name"], description=props.get("Description"), value=props.get("Value"),
            parameter_type=props.get("Type"), allowed_pattern=props.get("AllowedPattern"),
            keyid=None, overwrite=True, tags=None, data_type=props.get("DataType", "text"),
            tier=props.get("Tier"), policies=props.get("Policies"))
    new = cls.create_from_cloudformation_json(new_resource_name, cloudformation_json, account_id, region_name)
    if cloudformation_json.get("UpdateReplacePolicy") != "Retain":
        cls.delete_from_cloudformation_json(original_resource.name, cloudformation_json, account_id, region_name)
    return new


ssm_models.Parameter.update_from_cloudformation_json = classmethod(_update_parameter)

# 7. A parameter name that exists: CloudFormation's AlreadyExists failure.
_create_parameter = ssm_models.Parameter.create_from_cloudformation_json.__func__


def _create_parameter_once(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
    try:
        return _create_parameter(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
    except ssm_exceptions.ParameterAlreadyExists:
        name = cloudformation_json["Properties"].get("Name")
        raise cfn_exceptions.ValidationError(
            message=f"Resource of type 'AWS::SSM::Parameter' with identifier '{name}' already exists.") from None


ssm_models.Parameter.create_from_cloudformation_json = classmethod(_create_parameter_once)


# 5. {{resolve:ssm:NAME[:VERSION]}} in resource properties.
SSM_REFERENCE = re.compile(r"\{\{resolve:ssm:([A-Za-z0-9_./-]+)(?::(\d+))?\}\}")
_clean_json = parsing.clean_json


class UnresolvedReference(Exception):
    pass


def _resolve(text: str, account_id: str, region_name: str) -> str:
    backend = ssm_models.ssm_backends[account_id][region_name]

    def value(m: re.Match) -> str:
        name = m.group(1) + (f":{m.group(2)}" if m.group(2) else "")
        try:
            p = backend.get_parameter(name)
        except Exception as e:  # moto's ParameterVersionNotFound and the like
            raise UnresolvedReference(f"{m.group(0)}: {e}") from e
        if p is None:
            raise UnresolvedReference(f"{m.group(0)}: parameter {name} not found")
        return p.value

    return SSM_REFERENCE.sub(value, text)


def _clean_json_resolving(resource_json: Any, resources_map: Any) -> Any:
    out = _clean_json(resource_json, resources_map)
    if isinstance(out, str) and "{{resolve:ssm:" in out:
        return _resolve(out, resources_map._account_id, resources_map._region_name)
    return out


parsing.clean_json = _clean_json_resolving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args()
    # moto's server as scripts/dynamodb-local starts it (DynamoDB requests one at a time).
    sys.argv = ["moto-serialized.py", "-H", args.host, "-p", str(args.port)]
    runpy.run_path(str(ROOT / "scripts/moto-serialized.py"), run_name="__main__")


if __name__ == "__main__":
    main()
