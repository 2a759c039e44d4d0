"""The GitHub workflows (.github/workflows/) against what they drive: the release workflow runs
scripts/release and release/publish.py as docs/src/development/releasing.md says, only its publish
job can get an OIDC token, and the IAM policies on that page are what the publisher calls.
(actionlint and zizmor check the files themselves: scripts/check-workflows.)"""
from __future__ import annotations

import json
import re

import yaml

import publish
from conftest import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"
RELEASING = ROOT / "docs" / "src" / "development" / "releasing.md"


def load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def triggers(wf: dict) -> dict:
    # YAML 1.1 reads the key `on` as the boolean true.
    return wf.get("on", wf.get(True))


def runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def uses(job: dict) -> list[str]:
    return [step["uses"] for step in job["steps"] if "uses" in step]


def section(text: str, heading: str) -> str:
    assert heading in text.splitlines(), heading
    rest = text.split(heading + "\n", 1)[1]
    return re.split(r"^#{2,3} ", rest, maxsplit=1, flags=re.M)[0]


def json_blocks(text: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r"^ *```json\n(.*?)^ *```", text, re.M | re.S)]


def test_ci_runs_the_readmes_test_command_on_pull_requests():
    wf = load("ci.yml")
    assert "pull_request" in triggers(wf)
    assert "scripts/test     # the whole test suite" in (ROOT / "README.md").read_text()
    (job,) = wf["jobs"].values()
    assert re.search(r"(^|\s)scripts/test$", runs(job), re.M), runs(job)
    assert wf["permissions"] == {} and job["permissions"] == {"contents": "read"}


def test_the_release_workflow_builds_attaches_publishes_and_updates_the_table():
    wf = load("release.yml")
    assert triggers(wf) == {"push": {"tags": ["v*"]}}
    assert wf["permissions"] == {}
    jobs = wf["jobs"]
    assert re.search(r"^scripts/release$", runs(jobs["build"]), re.M), runs(jobs["build"])
    assert "sha256sum -c SHA256SUMS" in runs(jobs["build"])
    assert re.search(r"gh release create .*dist/\*", runs(jobs["github"]))
    publish_run = runs(jobs["publish"])
    assert "release/publish.py plan --dist dist" in publish_run
    assert "release/publish.py publish --dist dist" in publish_run and "--layers-json layers.json" in publish_run
    table_run = runs(jobs["table"])
    assert "gh release upload" in table_run and "layers.json" in table_run
    page = "docs/src/reference/layers.md"
    assert f"release/publish.py table --layers-json published/layers.json --page {page}" in table_run
    text = (ROOT / page).read_text()
    assert publish.TABLE_BEGIN in text and publish.TABLE_END in text
    assert jobs["table"]["needs"] == ["github", "publish"]


def test_only_the_publish_job_gets_an_oidc_token_and_no_job_a_stored_key():
    for name in ("ci.yml", "release.yml"):
        text = (WORKFLOWS / name).read_text()
        assert "secrets." not in text and "aws-access-key-id" not in text, name
        for job_name, job in load(name)["jobs"].items():
            perms = job.get("permissions")
            assert isinstance(perms, dict), f"{name} {job_name}: no permissions of its own"
            oidc = perms.get("id-token") == "write"
            assumes = [u for u in uses(job) if u.startswith("aws-actions/configure-aws-credentials@")]
            assert oidc == bool(assumes), f"{name} {job_name}: id-token {perms.get('id-token')}, uses {assumes}"
            if oidc:
                assert (name, job_name) == ("release.yml", "publish")
                assert perms == {"contents": "read", "id-token": "write"}
                (step,) = [s for s in job["steps"] if s.get("uses", "").startswith("aws-actions/")]
                assert step["with"]["role-to-assume"] == "${{ vars.FLIGHTLOCK_PUBLISH_ROLE_ARN }}"
                assert "environment" not in job  # the trust policy's subject names the tag


def test_every_action_is_pinned_by_commit_with_its_version_beside_it():
    for path in WORKFLOWS.glob("*.yml"):
        for line in path.read_text().splitlines():
            if "uses:" in line:
                assert re.search(r"uses: [\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d+(\.\d+)*$", line), f"{path.name}: {line.strip()}"


def test_the_trust_policy_admits_this_repositorys_version_tags_only():
    text = section(RELEASING.read_text(), "### What the account owner sets up once")
    (trust,) = json_blocks(text)
    (statement,) = trust["Statement"]
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert statement["Principal"]["Federated"].endswith(":oidc-provider/token.actions.githubusercontent.com")
    cond = statement["Condition"]
    assert cond["StringEquals"] == {"token.actions.githubusercontent.com:aud": "sts.amazonaws.com"}
    sub = cond["StringLike"]["token.actions.githubusercontent.com:sub"]
    (tag_filter,) = triggers(load("release.yml"))["push"]["tags"]
    assert sub == f"repo:<owner>/<repo>:ref:refs/tags/{tag_filter}"


def boto3_action(service: str, method: str) -> str:
    return f"{service}:" + "".join(w.capitalize() for w in method.split("_"))


def test_the_publishing_roles_policy_is_what_the_publisher_calls():
    source = (ROOT / "release" / "publish.py").read_text()
    calls = {boto3_action({"lam": "lambda", "ssm": "ssm"}[obj], m)
             for obj, m in re.findall(r"\b(lam|ssm)\.([a-z_]+)\(", source)}
    assert "lambda:PublishLayerVersion" in calls and "ssm:PutParameter" in calls, calls
    (policy,) = json_blocks(section(RELEASING.read_text(), "### The publishing role's permissions"))
    granted = {a for s in policy["Statement"] for a in s["Action"]}
    assert granted == calls
    for s in policy["Statement"]:
        assert s["Effect"] == "Allow" and isinstance(s["Resource"], str)
        for action in s["Action"]:
            if action in ("lambda:PublishLayerVersion", "lambda:ListLayerVersions"):  # on a layer
                assert s["Resource"] == f"arn:aws:lambda:*:<account>:layer:{publish.LAYER_PREFIX}-*"
            elif action.startswith("lambda:"):  # on a layer version
                assert s["Resource"] == f"arn:aws:lambda:*:<account>:layer:{publish.LAYER_PREFIX}-*:*"
            else:
                assert s["Resource"] == f"arn:aws:ssm:*:<account>:parameter{publish.SSM_PREFIX}/*"
    for arch in publish.ARCHES:
        assert publish.layer_name(arch, "1.2.3").startswith(f"{publish.LAYER_PREFIX}-")
        assert publish.ssm_name(arch, "1.2.3").startswith(f"{publish.SSM_PREFIX}/")
