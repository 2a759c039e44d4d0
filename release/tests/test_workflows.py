"""The GitHub workflows (.github/workflows/) against what they drive: CI runs the test command on
pull requests, pushes to main and the merge queue; the release workflow tests the tagged commit,
builds, creates the GitHub release and only then publishes (layers, SAR, packages) and
regenerates the ARN table; only publishing jobs get an OIDC token; the IAM policies of
docs/src/development/releasing.md are what the publisher calls; the build's pins (Rust toolchain,
cargo-lambda) and Dependabot's coverage. (actionlint and zizmor check the files themselves:
scripts/check-workflows.)"""
from __future__ import annotations

import json
import re
import subprocess
import tomllib

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


def test_ci_runs_the_readmes_test_command_on_pull_requests_main_and_the_merge_queue():
    wf = load("ci.yml")
    on = triggers(wf)
    assert set(on) == {"pull_request", "push", "merge_group"}, on
    assert on["push"] == {"branches": ["main"]}, on["push"]
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
    publish_run = runs(jobs["layers"])
    assert "release/publish.py plan --dist dist" in publish_run
    assert "release/publish.py publish --dist dist" in publish_run and "--layers-json layers.json" in publish_run
    table_run = runs(jobs["table"])
    assert "gh release upload" in table_run and "layers.json" in table_run
    page = "docs/src/reference/layers.md"
    assert f"release/publish.py table --layers-json published/layers.json --page {page}" in table_run
    text = (ROOT / page).read_text()
    assert publish.TABLE_BEGIN in text and publish.TABLE_END in text
    assert re.search(r"(^|\s)scripts/test$", runs(jobs["test"]), re.M), runs(jobs["test"])
    assert re.search(r"^\s*scripts/sam publish --template ", runs(jobs["sar"]), re.M), runs(jobs["sar"])
    assert "pypa/gh-action-pypi-publish@" in " ".join(uses(jobs["pypi"]))
    npm_run = runs(jobs["npm"])
    assert re.search(r"for tarball in \./dist/flightlock-\*\.tgz; do\n\s*npx --yes npm@[\d.]+ publish --provenance "
                     r"--access public \"\$\{tarball\}\"", npm_run), npm_run


def needs(job: dict) -> list[str]:
    n = job.get("needs", [])
    return [n] if isinstance(n, str) else n


def ancestors(jobs: dict, name: str) -> set[str]:
    """Every job that must finish before `name` starts (the transitive `needs`)."""
    seen: set[str] = set()
    todo = list(needs(jobs[name]))
    while todo:
        j = todo.pop()
        if j not in seen:
            seen.add(j)
            todo.extend(needs(jobs[j]))
    return seen


def publishes(job: dict) -> bool:
    """A job that makes something public outside the repository."""
    text = runs(job)
    return bool(
        [u for u in uses(job) if u.startswith(("aws-actions/configure-aws-credentials@", "pypa/gh-action-pypi-publish@"))]
        or re.search(r"\bnpm(@[\d.]+)? publish\b|\bsam publish\b|publish\.py publish\b|gh pr create", text)
    )


def test_the_release_publishes_only_after_the_tests_and_the_github_release_in_order():
    jobs = load("release.yml")["jobs"]
    (tests,) = [n for n, j in jobs.items() if re.search(r"(^|\s)scripts/test$", runs(j), re.M)]
    (release,) = [n for n, j in jobs.items() if "gh release create" in runs(j)]
    (build,) = [n for n, j in jobs.items() if re.search(r"^scripts/release$", runs(j), re.M)]
    assert tests in ancestors(jobs, build), "the release is built before its tests passed"
    assert build in ancestors(jobs, release)
    publishing = [n for n, j in jobs.items() if publishes(j)]
    assert set(publishing) >= {"layers", "sar", "pypi", "npm", "table"}, publishing
    for name in publishing:
        before = ancestors(jobs, name)
        assert {tests, build, release} <= before, f"{name} can publish before {({tests, build, release} - before)}"
        assert "if" not in jobs[name] or "always()" not in str(jobs[name]["if"]), name
    # The order of the public steps: layers, then SAR (its template names them), then the
    # packages, then the ARN table of what was published.
    assert "layers" in ancestors(jobs, "sar")
    assert "sar" in ancestors(jobs, "pypi") and "sar" in ancestors(jobs, "npm")
    assert {"layers", "sar", "pypi", "npm"} <= ancestors(jobs, "table")


def test_only_publishing_jobs_get_an_oidc_token_and_no_job_a_stored_key():
    for name in ("ci.yml", "release.yml"):
        text = (WORKFLOWS / name).read_text()
        assert "secrets." not in text and "aws-access-key-id" not in text, name
        for job_name, job in load(name)["jobs"].items():
            perms = job.get("permissions")
            assert isinstance(perms, dict), f"{name} {job_name}: no permissions of its own"
            oidc = perms.get("id-token") == "write"
            assumes = [u for u in uses(job) if u.startswith("aws-actions/configure-aws-credentials@")]
            pypi = [u for u in uses(job) if u.startswith("pypa/gh-action-pypi-publish@")]
            npm = re.search(r"\bnpm(@[\d.]+)? publish --provenance\b", runs(job))
            assert oidc == bool(assumes or pypi or npm), f"{name} {job_name}: id-token {perms.get('id-token')}, uses {uses(job)}"
            if not oidc:
                continue
            assert name == "release.yml" and job_name in ("layers", "sar", "pypi", "npm"), (name, job_name)
            if assumes:
                assert perms == {"contents": "read", "id-token": "write"}
                (step,) = [s for s in job["steps"] if s.get("uses", "").startswith("aws-actions/")]
                assert step["with"]["role-to-assume"] == "${{ vars.FLIGHTLOCK_PUBLISH_ROLE_ARN }}"
                assert "environment" not in job  # the trust policy's subject names the tag
            else:
                # PyPI's and npm's trusted publishers name the workflow and the environment.
                assert perms == {"id-token": "write"} and job.get("environment") == job_name, job_name


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


def test_the_rust_toolchain_is_pinned_no_lower_than_the_workspaces_rust_version():
    toolchain = tomllib.loads((ROOT / "rust-toolchain.toml").read_text())["toolchain"]
    channel = toolchain["channel"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", channel), f"pin an exact release, not {channel!r}"
    assert "targets" not in toolchain  # rustup would download them before any cargo command
    workspace = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["rust-version"]

    def v(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in text.split("."))

    assert v(channel) >= v(workspace), (channel, workspace)
    # That rust-version is no lower than any locked dependency's is tests/template's check.


def test_cargo_lambda_is_pinned_to_one_release():
    text = (ROOT / "scripts" / "install-cargo-lambda").read_text()
    assert re.search(r"^readonly VERSION='\d+\.\d+\.\d+'$", text, re.M), "cargo-lambda is not pinned"
    assert 'SPEC="cargo-lambda==${VERSION}"' in text


def test_dependabot_watches_every_manifest_in_the_tree():
    config = yaml.safe_load((ROOT / ".github" / "dependabot.yml").read_text())
    watched = {(u["package-ecosystem"], u["directory"]) for u in config["updates"]}
    wanted = {("github-actions", "/"), ("cargo", "/")}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    for path in tracked.splitlines():
        name = path.rsplit("/", 1)[-1]
        if name == "package.json":
            ecosystem = "npm"
        elif name == "pyproject.toml" or re.fullmatch(r"requirements.*\.txt", name):
            ecosystem = "pip"
        else:
            continue
        wanted.add((ecosystem, "/" + path.rsplit("/", 1)[0] if "/" in path else "/"))
    missing = wanted - watched
    assert not missing, f"Dependabot does not watch {sorted(missing)}"
