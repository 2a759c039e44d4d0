"""The Python wheel as a user gets it: scripts/check-cdk --pack installs the wheel jsii-pacmak
built into a venv under target/ and runs this program there, so `flightlock_cdk` is the installed
wheel (its jsii assembly run by the jsii kernel on node). It synthesizes the stack of
test/packaged/synth.ts and checks the same things: the lock table's schema, the function's
layer, wrapper and variables, and the lock user's actions on the table. Both write the template
so that scripts/check-cdk can compare them.

Usage: python synth.py <expected version> <template out>
"""
from __future__ import annotations

import json
import sys

from aws_cdk import App, Duration, Environment, Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk.assertions import Template
from flightlock_cdk import Flightlock, FlightlockLayer, OnBusy

LOCK_USER_ACTIONS = ["dynamodb:Query", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem",
                     "dynamodb:DescribeTable", "dynamodb:DescribeTimeToLive"]


def fail(what: str, got: object, want: object) -> None:
    sys.exit(f"synth.py: {what}: got {json.dumps(got)}, want {json.dumps(want)}")


def expect(what: str, got: object, want: object) -> None:
    if got != want:
        fail(what, got, want)


def main(version: str, out: str) -> None:
    expect("FlightlockLayer.VERSION (the release the wheel was built for)", FlightlockLayer.VERSION, version)

    # Analytics off: its metadata names the language, and the two templates are compared.
    app = App(analytics_reporting=False)
    stack = Stack(app, "Packaged", env=Environment(account="111111111111", region="eu-west-1"))
    job = lambda_.Function(stack, "Job", runtime=lambda_.Runtime.PYTHON_3_12,
                           architecture=lambda_.Architecture.ARM_64, handler="index.handler",
                           code=lambda_.Code.from_inline("def handler(event, context):\n    return {}\n"))
    locks = Flightlock(stack, "Flightlock", create_table=True)
    locks.attach(job, key="nightly", wait=Duration.seconds(30), on_busy=OnBusy.ERROR)

    # The construct's own refusals reach Python as the RuntimeError the jsii kernel raises, with
    # their message.
    other = lambda_.Function(stack, "Other", runtime=lambda_.Runtime.PYTHON_3_12, handler="index.handler",
                             code=lambda_.Code.from_inline("def handler(event, context):\n    return {}\n"))
    try:
        locks.attach(other, settings={"FLIGHTLOCK_NOPE": "1"})
    except RuntimeError as e:
        if "FLIGHTLOCK_NOPE, which the extension does not read" not in str(e):
            fail("the refusal of an unknown setting", str(e), "FLIGHTLOCK_NOPE, which the extension does not read")
    else:
        sys.exit("synth.py: attach accepted FLIGHTLOCK_NOPE, a variable the extension does not read")

    template = Template.from_stack(stack).to_json()
    with open(out, "w") as f:
        f.write(json.dumps(template, indent=1) + "\n")
    resources = template["Resources"]

    def of_type(kind: str) -> list[tuple[str, dict]]:
        return [(rid, r) for rid, r in resources.items() if r["Type"] == kind]

    # The table, as template.yaml declares it.
    tables = of_type("AWS::DynamoDB::Table")
    expect("the number of lock tables", len(tables), 1)
    table_id, table = tables[0]
    props = table["Properties"]
    expect("the table's key schema", props["KeySchema"],
           [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}])
    expect("the table's TTL", props["TimeToLiveSpecification"], {"AttributeName": "expiresAt", "Enabled": True})
    expect("the table's billing mode", props["BillingMode"], "PAY_PER_REQUEST")
    expect("the table's deletion protection", props["DeletionProtectionEnabled"], True)

    # The function: the arm64 layer of this release from SSM, the wrapper, the table, the options.
    jobs = [fn for rid, fn in of_type("AWS::Lambda::Function") if rid.startswith("Job")]
    expect("the number of attached functions", len(jobs), 1)
    fn = jobs[0]["Properties"]
    expect("the number of layers", len(fn["Layers"]), 1)
    parameter = template["Parameters"][fn["Layers"][0]["Ref"]]
    expect("the layer parameter's type", parameter["Type"], "AWS::SSM::Parameter::Value<String>")
    expect("the layer parameter", parameter["Default"], f"/flightlock/layer/arm64/{version}")
    expect("the function's variables", fn["Environment"]["Variables"], {
        "AWS_LAMBDA_EXEC_WRAPPER": "/opt/flightlock-wrapper",
        "FLIGHTLOCK_TABLE": {"Ref": table_id},
        "FLIGHTLOCK_KEY": "nightly",
        "FLIGHTLOCK_WAIT": "30s",
        "FLIGHTLOCK_ON_BUSY": "error",
    })

    # The lock user's actions on that table, on the function's role.
    role = fn["Role"]["Fn::GetAtt"][0]
    statements = [s for _, p in of_type("AWS::IAM::Policy")
                  if any(r.get("Ref") == role for r in p["Properties"]["Roles"])
                  for s in p["Properties"]["PolicyDocument"]["Statement"]]
    expect("the role's DynamoDB statements", [s for s in statements if "dynamodb:" in json.dumps(s["Action"])],
           [{"Effect": "Allow", "Action": LOCK_USER_ACTIONS, "Resource": {"Fn::GetAtt": [table_id, "Arn"]}}])
    print(f"the wheel flightlock_cdk {version}: its stack holds the table, the layer wiring and the lock user's policy")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python synth.py <expected version> <template out>")
    main(sys.argv[1], sys.argv[2])
