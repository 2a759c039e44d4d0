"""release/dry_run.py's own parts, quickly: the expressions it evaluates, the dry forms it requires
the workflow's publishing commands to have, the stand-ins it refuses to invent, and the `gh`
stand-in's checks. (The whole dry run, with a release build, is scripts/check-release.)"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

import dry_run
from conftest import ROOT

GH = ROOT / "release" / "dry-run-bin" / "gh"
CONTEXTS = {"vars": {"SET": "x"}, "github": {"ref_name": "v1.2.3"}, "steps": {"r": {"outputs": {"first": "us-east-1"}}}}


def test_expressions_the_workflow_uses():
    assert dry_run.evaluate("vars.SET", CONTEXTS) == "x"
    assert dry_run.evaluate("vars.UNSET || '*'", CONTEXTS) == "*"
    assert dry_run.evaluate("vars.SET || '*'", CONTEXTS) == "x"
    assert dry_run.evaluate("vars.SET != ''", CONTEXTS) is True
    assert dry_run.evaluate("vars.UNSET != ''", CONTEXTS) is False
    assert dry_run.evaluate("github.ref_name == 'v1.2.3'", CONTEXTS) is True
    assert dry_run.substitute("flightlock-${{ github.ref_name }}-${{ steps.r.outputs.first }}", CONTEXTS) == \
        "flightlock-v1.2.3-us-east-1"
    assert dry_run.substitute(False, CONTEXTS) == "false"
    assert dry_run.condition("${{ vars.UNSET != '' }}", CONTEXTS) is False
    assert dry_run.condition(None, CONTEXTS) is True


@pytest.mark.parametrize("expr", ["always()", "contains(vars.SET, 'x')", "vars.SET && vars.SET", "1 + 1"])
def test_an_expression_it_cannot_evaluate_is_an_error_not_a_guess(expr):
    with pytest.raises(dry_run.DryRunError):
        dry_run.evaluate(expr, CONTEXTS)


def test_every_dry_form_applies_to_the_workflow_as_it_is():
    """The run fails if a rewrite applies nowhere; this says so without a release build."""
    wf = yaml.safe_load(dry_run.WORKFLOW.read_text())
    text = "\n".join(s.get("run", "") for j in wf["jobs"].values() for s in j["steps"])
    for r in dry_run.rewrites("python3"):
        r.apply(text)
        assert r.applied >= 1, f"the workflow no longer runs {r.what}"
    npm = dry_run.rewrites("python3")[0].apply("npx --yes npm@11.21.2 publish --provenance --access public a.tgz")
    assert npm == "npx --yes npm@11.21.2 publish --dry-run --access public a.tgz"


def test_every_action_the_workflow_uses_has_a_stand_in(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    run = dry_run.Run(tmp_path, dry_run.WORKFLOW)
    wf = yaml.safe_load(dry_run.WORKFLOW.read_text())
    used = {s["uses"].split("@")[0] for j in wf["jobs"].values() for s in j["steps"] if "uses" in s}
    known = {"actions/checkout", "actions/setup-node", "actions/upload-artifact", "actions/download-artifact",
             "aws-actions/configure-aws-credentials", "pypa/gh-action-pypi-publish"}
    assert used <= known, used - known
    with pytest.raises(dry_run.DryRunError, match="no stand-in"):
        run.action("npm", "someone/publish-anywhere", {}, {}, tmp_path)
    for job in wf["jobs"].values():
        assert set(job) <= dry_run.JOB_KEYS
        for s in job["steps"]:
            assert set(s) <= dry_run.STEP_KEYS, s


def test_aws_calls_only_go_to_this_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://lambda.us-east-1.amazonaws.com")
    with pytest.raises(dry_run.DryRunError, match="local server only"):
        dry_run.Run(tmp_path, dry_run.WORKFLOW)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    with pytest.raises(dry_run.DryRunError, match="local server only"):
        dry_run.Run(tmp_path, dry_run.WORKFLOW)


@pytest.fixture
def github(tmp_path):
    """A checkout whose origin holds tag v1 and branch main; the gh stand-in's environment."""
    origin, work, store = tmp_path / "origin.git", tmp_path / "work", tmp_path / "github"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    (work / "a.txt").write_text("a")
    subprocess.run(git + ["add", "a.txt"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "a"], check=True)
    subprocess.run(git + ["tag", "v1"], check=True)
    subprocess.run(git + ["remote", "add", "origin", str(origin)], check=True)
    subprocess.run(git + ["push", "-q", "origin", "main", "v1"], check=True)
    (work / "notes.md").write_text("the notes\n")
    store.mkdir()
    env = dict(os.environ, FLIGHTLOCK_DRY_RUN_GITHUB=str(store), GH_TOKEN="t", GH_REPO="o/r")
    return work, store, env


def gh(work: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(GH), *args], cwd=work, env=env, capture_output=True, text=True)


def test_gh_release_create_checks_the_tag_the_notes_and_the_files(github):
    work, store, env = github
    ok = ["--verify-tag", "--title", "t", "--notes-file", "notes.md", "a.txt"]
    assert "does not exist in origin" in gh(work, env, "release", "create", "v2", *ok).stderr
    assert "--verify-tag" in gh(work, env, "release", "create", "v1", *ok[1:]).stderr
    (work / "empty.md").write_text("\n")
    assert "is empty" in gh(work, env, "release", "create", "v1", *ok[:3], "--notes-file", "empty.md", "a.txt").stderr
    assert "not a file" in gh(work, env, "release", "create", "v1", *ok[:-1], "missing.zip").stderr
    r = gh(work, env, "release", "create", "v1", *ok)
    assert r.returncode == 0, r.stderr
    assert (store / "releases" / "v1" / "a.txt").read_text() == "a"
    assert "already exists" in gh(work, env, "release", "create", "v1", *ok).stderr
    assert "already on release" in gh(work, env, "release", "upload", "v1", "a.txt").stderr
    assert gh(work, env, "release", "upload", "v1", "a.txt", "--clobber").returncode == 0
    assert "does not exist" in gh(work, env, "release", "upload", "v9", "a.txt").stderr
    calls = [json.loads(line)["call"] for line in (store / "calls.jsonl").read_text().splitlines()]
    assert calls == ["release create", "release upload"]


def test_gh_pr_create_needs_the_branch_pushed_and_unknown_calls_fail(github):
    work, store, env = github
    pr = ["pr", "create", "--base", "main", "--title", "t", "--body", "b", "--head"]
    assert "push it first" in gh(work, env, *pr, "release/layers-v1").stderr
    subprocess.run(["git", "-C", str(work), "push", "-q", "origin", "HEAD:refs/heads/release/layers-v1"], check=True)
    assert gh(work, env, *pr, "release/layers-v1").returncode == 0
    assert "not a call the release workflow makes" in gh(work, env, "repo", "delete").stderr
    assert "GH_TOKEN" in gh(work, {k: v for k, v in env.items() if k != "GH_TOKEN"}, "pr", "list").stderr
