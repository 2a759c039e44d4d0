#!/usr/bin/env python3
"""release/dry_run.py — runs the release workflow (.github/workflows/release.yml) on this machine,
job by job and step by step, without publishing anything (scripts/check-release runs it).

    dry_run.py run [--work DIR] [--workflow FILE]     (AWS_ENDPOINT_URL must name a local server)
    dry_run.py sar-publish --template FILE            (what `sam publish` stands in for; below)

What runs is the workflow's own text: each `run:` block as GitHub's runner runs it (bash -eo
pipefail, the step's and job's `env:` with their `${{ }}` expressions evaluated, GITHUB_OUTPUT
read back into `steps.<id>.outputs`), in the job's own fresh checkout, the jobs in their `needs`
order. So a broken awk line, a wrong glob, a missing file or a job that needs what an earlier job
did not hand over fails here as it would on a tag. The `test` job is the caller (scripts/test)
and is not run again.

What is not GitHub or AWS is replaced, and only that:
  - the checkout is a bare repository in the work directory holding one commit: the working tree
    as it is (tracked and untracked files, .gitignore applied; HEAD itself when the tree is
    clean), tagged v<workspace version> and pushed as `main`. The build job's checkout has a
    fixed path, so its cargo target directory (and cdk/node_modules) is reused by the next run;
    every other job gets a fresh clone, as a fresh runner would. `.tools/` is linked to this
    checkout's, so the pinned tools are not installed again.
  - artifacts are directories in the work directory (upload-artifact / download-artifact).
  - configure-aws-credentials gives dummy keys; every AWS call goes to AWS_ENDPOINT_URL (moto's
    server, started by scripts/check-release): the layers are really published there, in two
    regions, the SSM parameters written, the SAR code uploaded to its S3 bucket.
  - `gh` (GitHub's CLI) is release/dry-run-bin/gh: it checks each call (the tag exists in the
    checkout's origin, the notes are not empty, the files exist, the pull request's branch was
    pushed) and keeps the release's files in the work directory.
  - three publishing steps run in their dry forms, each required to occur (so the workflow cannot
    drop or rename one without this run failing):
      `npm publish --provenance` -> `npm publish --dry-run` (npm packs and checks the tarball);
      `scripts/sam publish --template T` -> `dry_run.py sar-publish --template T`: the metadata
      parsed by serverlessrepo, the library `sam publish` calls, and every S3 location the
      packaged template names fetched back from the bucket (SAR has no local server);
      pypa/gh-action-pypi-publish -> `twine check --strict` on its packages directory (what the
      action verifies before it uploads).

Afterwards: the GitHub release holds every file of the build's dist/ and layers.json; layers.json
names every region and architecture; the pull request's branch has the regenerated ARN table.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
REGIONS = "us-east-1,eu-west-1"
SAR_REGION = "us-east-1"
SAR_BUCKET = "flightlock-sar-dry-run"
ROLE = "arn:aws:iam::123456789012:role/flightlock-publish-dry-run"
REPOSITORY = "flightlock/flightlock"
# The repository variables an account owner sets (docs/src/development/releasing.md).
VARS = {
    "FLIGHTLOCK_PUBLISH_ROLE_ARN": ROLE,
    "FLIGHTLOCK_PUBLISH_REGIONS": REGIONS,
    "FLIGHTLOCK_SAR_REGION": SAR_REGION,
    "FLIGHTLOCK_SAR_BUCKET": SAR_BUCKET,
}
# The caller's job: scripts/test is what runs this.
CALLER_JOB = "test"
JOB_KEYS = {"name", "needs", "if", "runs-on", "timeout-minutes", "permissions", "steps", "environment"}
STEP_KEYS = {"name", "id", "uses", "with", "env", "run", "if"}


class DryRunError(Exception):
    """The workflow would fail (or does something this run cannot stand in for): the message says
    which job and step, and why."""


def log(msg: str) -> None:
    print(f"dry-run: {msg}", file=sys.stderr, flush=True)


# --- ${{ }} expressions ---------------------------------------------------------------------------

def lookup(path: str, contexts: dict[str, Any]) -> Any:
    value: Any = contexts
    for part in path.split("."):
        if not isinstance(value, dict):
            raise DryRunError(f"'{path}': '{part}' of a non-object")
        value = value.get(part, "")
    return value


def operand(text: str, contexts: dict[str, Any]) -> Any:
    text = text.strip()
    if m := re.fullmatch(r"'((?:[^']|'')*)'", text):
        return m.group(1).replace("''", "'")
    if re.fullmatch(r"[A-Za-z_][\w-]*(\.[\w-]+)*", text):
        return lookup(text, contexts)
    raise DryRunError(f"expression '{text}': only context paths, 'strings', ==, != and || are evaluated here")


def evaluate(expr: str, contexts: dict[str, Any]) -> Any:
    """The expressions the workflow uses: a path, a 'literal', `a || b`, `a == b`, `a != b`."""
    for alt in re.split(r"\s*\|\|\s*", expr.strip()):
        if m := re.fullmatch(r"(.+?)\s*(==|!=)\s*(.+)", alt):
            left, right = operand(m.group(1), contexts), operand(m.group(3), contexts)
            value: Any = (left == right) == (m.group(2) == "==")
        else:
            value = operand(alt, contexts)
        if value:
            return value
    return value


def substitute(text: Any, contexts: dict[str, Any]) -> str:
    if isinstance(text, bool):  # YAML's true/false, as GitHub hands them to an action
        return "true" if text else "false"

    def one(m: re.Match) -> str:
        v = evaluate(m.group(1), contexts)
        return "true" if v is True else "false" if v is False else str(v)
    return re.sub(r"\$\{\{(.*?)\}\}", one, str(text))


def condition(text: Any, contexts: dict[str, Any]) -> bool:
    if text is None:
        return True
    t = str(text).strip()
    if t.startswith("${{") and t.endswith("}}"):
        t = t[3:-2]
    return bool(evaluate(t, contexts))


# --- the dry forms of the publishing commands -----------------------------------------------------

class Rewrite:
    def __init__(self, what: str, pattern: str, replacement: str):
        self.what, self.pattern, self.replacement, self.applied = what, re.compile(pattern), replacement, 0

    def apply(self, text: str) -> str:
        text, n = self.pattern.subn(self.replacement, text)
        self.applied += n
        return text


def rewrites(python: str) -> list[Rewrite]:
    me = shlex.quote(str(Path(__file__).resolve()))
    return [
        Rewrite("npm publish --provenance", r"\b(npm(?:@[\d.]+)? publish) --provenance\b", r"\1 --dry-run"),
        Rewrite("scripts/sam publish", r"\bscripts/sam publish\b", f"{shlex.quote(python)} {me} sar-publish"),
    ]


# --- the run ---------------------------------------------------------------------------------------

def git(*args: str, cwd: Path = ROOT, env: dict | None = None) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise DryRunError(f"git {' '.join(args)} (in {cwd}): {r.stderr.strip()}")
    return r.stdout.strip()


def workspace_version() -> str:
    out = subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1", "--locked"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return next(p["version"] for p in json.loads(out)["packages"] if p["name"] == "flightlock")


def snapshot(work: Path, tag: str) -> str:
    """The working tree as one commit in a bare origin (tagged, and as `main`); its sha."""
    if git("status", "--porcelain"):
        index = work / "snapshot.index"
        index.unlink(missing_ok=True)
        # A fixed identity and HEAD's date: the same tree gives the same commit, so the build
        # that names its commit (FLIGHTLOCK_BUILD_COMMIT) is not redone for an unchanged tree.
        date = git("show", "-s", "--format=%cI", "HEAD")
        env = dict(os.environ, GIT_INDEX_FILE=str(index), GIT_AUTHOR_NAME="release dry run",
                   GIT_AUTHOR_EMAIL="dry-run@flightlock.invalid", GIT_COMMITTER_NAME="release dry run",
                   GIT_COMMITTER_EMAIL="dry-run@flightlock.invalid", GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
        git("read-tree", "HEAD", env=env)
        git("add", "-A", env=env)
        tree = git("write-tree", env=env)
        sha = git("commit-tree", tree, "-p", "HEAD", "-m", "release dry run: the working tree", env=env)
        index.unlink()
        log(f"the working tree has changes: dry-running a commit of it ({sha[:12]}, on top of HEAD)")
    else:
        sha = git("rev-parse", "HEAD")
    origin = work / "origin.git"
    shutil.rmtree(origin, ignore_errors=True)
    git("init", "-q", "--bare", str(origin))
    git("push", "-q", "--force", str(origin), f"{sha}:refs/heads/main", f"{sha}:refs/tags/{tag}")
    return sha


def checkout(work: Path, job: str, sha: str) -> Path:
    """A checkout of the snapshot for one job: fresh, except the build job's (kept, cleaned)."""
    origin = work / "origin.git"
    if job == "build":
        d = work / "checkouts" / "build"
        if not (d / ".git").is_dir():
            shutil.rmtree(d, ignore_errors=True)
            git("clone", "-q", str(origin), str(d))
        git("fetch", "-q", "--tags", "--force", "origin", cwd=d)
        git("checkout", "-q", "--force", "--detach", sha, cwd=d)
        git("clean", "-q", "-f", "-d", cwd=d)  # untracked files go; ignored ones (target/) stay
    else:
        d = work / "checkouts" / job
        git("clone", "-q", str(origin), str(d))
        git("checkout", "-q", "--detach", sha, cwd=d)
    # This checkout's tools, linked (a link is not the directory .gitignore's `.tools/` names, so
    # it is excluded by name: scripts/release refuses a checkout with untracked files).
    tools = d / ".tools"
    if not tools.exists():
        (ROOT / ".tools").mkdir(exist_ok=True)
        tools.symlink_to(ROOT / ".tools")
    with open(d / ".git" / "info" / "exclude", "a+") as f:
        f.seek(0)
        if "/.tools\n" not in f.read():
            f.write("/.tools\n")
    return d


def order(jobs: dict[str, dict]) -> list[str]:
    done: list[str] = []
    while len(done) < len(jobs):
        ready = [n for n, j in jobs.items() if n not in done and all(x in done for x in needs(j))]
        if not ready:
            raise DryRunError(f"the jobs' needs form a cycle: {sorted(set(jobs) - set(done))}")
        done.append(ready[0])
    return done


def needs(job: dict) -> list[str]:
    n = job.get("needs", [])
    return [n] if isinstance(n, str) else list(n)


class Run:
    def __init__(self, work: Path, workflow: Path):
        self.work = work
        self.workflow = yaml.safe_load(workflow.read_text())
        self.python = sys.executable
        self.rewrites = rewrites(self.python)
        self.endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
        if urlparse(self.endpoint).hostname not in ("127.0.0.1", "localhost"):
            raise DryRunError(f"AWS_ENDPOINT_URL is '{self.endpoint}': a dry run sends AWS calls to a local "
                              "server only (scripts/check-release starts moto's)")
        self.artifacts = work / "artifacts"
        self.github = work / "github"
        self.times: list[tuple[str, float]] = []
        self.pypi_checked = False  # the PyPI action's stand-in ran

    def base_env(self, job: str, home: Path) -> dict[str, str]:
        """This machine's environment (its certificates, registries and toolchains) without what
        would make a step see another run's state: AWS, GitHub, cargo overrides, flightlock's own."""
        drop = ("AWS_", "GITHUB_", "FLIGHTLOCK_", "RUNNER_", "ACTIONS_")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(drop) and k not in ("CARGO_TARGET_DIR", "RUSTFLAGS", "VIRTUAL_ENV")}
        env["PATH"] = f"{ROOT / 'release' / 'dry-run-bin'}:{env.get('PATH', '/usr/bin:/bin')}"
        env.update(
            CI="true", GITHUB_ACTIONS="true", GITHUB_JOB=job, GITHUB_REPOSITORY=REPOSITORY,
            GITHUB_SHA=self.sha, GITHUB_REF_NAME=self.tag, GITHUB_WORKSPACE=str(home),
            FLIGHTLOCK_DRY_RUN_GITHUB=str(self.github),
            # No credentials until configure-aws-credentials; the endpoint from the start, so a
            # call made before it cannot reach AWS either.
            AWS_ENDPOINT_URL=self.endpoint, AWS_EC2_METADATA_DISABLED="true", SAM_CLI_TELEMETRY="0",
        )
        return env

    def contexts(self, steps: dict, home: Path) -> dict[str, Any]:
        return {
            "github": {
                "ref_name": self.tag, "sha": self.sha, "repository": REPOSITORY, "token": "dry-run-token",
                "run_id": "1", "server_url": str(self.work / "origin.git"), "workspace": str(home),
                "event": {"repository": {"default_branch": "main"}},
            },
            "vars": VARS,
            "steps": steps,
        }

    def run(self) -> None:
        started = time.monotonic()
        for d in (self.artifacts, self.github):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        self.version = workspace_version()
        self.tag = f"v{self.version}"
        self.sha = snapshot(self.work, self.tag)
        import boto3  # the release venv's; the calls go to AWS_ENDPOINT_URL
        boto3.client("s3", region_name=SAR_REGION).create_bucket(Bucket=SAR_BUCKET)
        jobs = self.workflow["jobs"]
        if CALLER_JOB not in jobs or not re.search(r"(^|\s)scripts/test$", "\n".join(
                s.get("run", "") for s in jobs[CALLER_JOB]["steps"]), re.M):
            raise DryRunError(f"the workflow has no job '{CALLER_JOB}' running scripts/test (the caller of this run)")
        for name in order(jobs):
            if name == CALLER_JOB:
                log(f"job {name}: scripts/test, the run that called this one")
                continue
            self.job(name, jobs[name])
        unused = [r.what for r in self.rewrites if not r.applied]
        if not self.pypi_checked:
            unused.append("pypa/gh-action-pypi-publish")
        if unused:
            raise DryRunError(f"the workflow no longer runs {unused}: its dry forms (release/dry_run.py) "
                              "must follow what the workflow publishes with")
        self.verify()
        log("every job ran; step times:")
        for what, took in self.times:
            print(f"  {took:7.1f}s  {what}", file=sys.stderr)
        print(f"  {time.monotonic() - started:7.1f}s  total", file=sys.stderr)

    def job(self, name: str, job: dict) -> None:
        extra = set(job) - JOB_KEYS
        if extra:
            raise DryRunError(f"job {name}: keys {sorted(extra)} are not stood in for here")
        home = self.work / "checkouts" / name
        if name != "build":  # a fresh runner's empty workspace (the build job's is kept: its cargo cache)
            shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True, exist_ok=True)
        steps: dict[str, Any] = {}
        if not condition(job.get("if"), self.contexts(steps, home)):
            raise DryRunError(f"job {name} would be skipped (if: {job['if']}) with the variables an account owner sets")
        log(f"job {name}: {job.get('name', name)}")
        env = self.base_env(name, home)
        timeout = 60 * int(job.get("timeout-minutes", 360))
        for i, step in enumerate(job["steps"]):
            extra = set(step) - STEP_KEYS
            if extra:
                raise DryRunError(f"job {name} step {i}: keys {sorted(extra)} are not stood in for here")
            ctx = self.contexts(steps, home)
            if not condition(step.get("if"), ctx):
                continue
            what = f"{name}: {step.get('name') or step.get('uses') or step['run'].splitlines()[0]}"
            t = time.monotonic()
            step_env = {k: substitute(v, ctx) for k, v in step.get("env", {}).items()}
            with_ = {k: substitute(v, ctx) for k, v in step.get("with", {}).items()}
            if "uses" in step:
                self.action(name, step["uses"].split("@")[0], with_, env, home)
            else:
                outputs = self.shell(name, i, step["run"], {**env, **step_env}, home, timeout)
                if "id" in step:
                    steps[step["id"]] = {"outputs": outputs}
            took = time.monotonic() - t
            self.times.append((what, took))
            log(f"  ok ({took:.1f}s) {what}")

    def shell(self, job: str, i: int, text: str, env: dict[str, str], home: Path, timeout: int) -> dict[str, str]:
        for r in self.rewrites:
            text = r.apply(text)
        logs = self.work / "logs"
        logs.mkdir(exist_ok=True)
        script, output, out_log = logs / f"{job}.{i}.sh", logs / f"{job}.{i}.output", logs / f"{job}.{i}.log"
        script.write_text(text)
        output.write_text("")
        with open(out_log, "w") as f:
            r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=home,
                               env={**env, "GITHUB_OUTPUT": str(output)}, stdout=f, stderr=subprocess.STDOUT,
                               timeout=timeout)
        if r.returncode != 0:
            tail = "\n".join(out_log.read_text().splitlines()[-60:])
            raise DryRunError(f"job {job}, step {i} exited {r.returncode}; the end of {out_log}:\n{tail}")
        outputs = {}
        for line in output.read_text().splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                outputs[k] = v
        return outputs

    def action(self, job: str, action: str, with_: dict[str, str], env: dict[str, str], home: Path) -> None:
        if action == "actions/checkout":
            ref = with_.get("ref")
            if ref and ref not in ("main", self.tag):
                raise DryRunError(f"job {job}: checkout of '{ref}', a ref this run does not have")
            if with_.get("persist-credentials") != "false":
                raise DryRunError(f"job {job}: a checkout that keeps the token in .git/config")
            checkout(self.work, job, self.sha)
        elif action == "actions/setup-node":
            major = subprocess.run(["node", "-p", "process.versions.node.split('.')[0]"], capture_output=True,
                                   text=True, check=True).stdout.strip()
            if int(major) < int(with_.get("node-version", "20")):
                raise DryRunError(f"job {job}: Node {with_.get('node-version')} asked for, {major} here")
        elif action == "actions/upload-artifact":
            src = home / with_["path"]
            files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else []
            if not files:
                raise DryRunError(f"job {job}: upload-artifact '{with_['name']}': no files at {with_['path']}")
            dest = self.artifacts / with_["name"]
            if dest.exists():
                raise DryRunError(f"job {job}: artifact '{with_['name']}' uploaded twice")
            if src.is_dir():
                shutil.copytree(src, dest)
            else:
                dest.mkdir()
                shutil.copy2(src, dest / src.name)
        elif action == "actions/download-artifact":
            src = self.artifacts / with_["name"]
            if not src.is_dir():
                raise DryRunError(f"job {job}: download-artifact '{with_['name']}': no earlier job uploaded it")
            shutil.copytree(src, home / with_["path"], dirs_exist_ok=True)
        elif action == "aws-actions/configure-aws-credentials":
            role = with_.get("role-to-assume", "")
            if not re.fullmatch(r"arn:aws:iam::\d{12}:role/[\w+=,.@/-]+", role):
                raise DryRunError(f"job {job}: configure-aws-credentials with role '{role}'")
            region = with_.get("aws-region", "")
            if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", region):
                raise DryRunError(f"job {job}: configure-aws-credentials with region '{region}'")
            env.update(AWS_ACCESS_KEY_ID="dry-run", AWS_SECRET_ACCESS_KEY="dry-run", AWS_SESSION_TOKEN="dry-run",
                       AWS_REGION=region, AWS_DEFAULT_REGION=region)
        elif action == "pypa/gh-action-pypi-publish":
            packages = home / with_.get("packages-dir", "dist")
            files = sorted(packages.glob("*"))
            if not any(f.suffix == ".whl" for f in files) or not any(f.name.endswith(".tar.gz") for f in files):
                raise DryRunError(f"job {job}: {packages} has no wheel and sdist: {[f.name for f in files]}")
            r = subprocess.run([self.python, "-m", "twine", "check", "--strict", *map(str, files)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise DryRunError(f"job {job}: twine check refused the packages:\n{r.stdout}{r.stderr}")
            self.pypi_checked = True
            log(f"  twine check --strict passed: {', '.join(f.name for f in files)} (not uploaded)")
        else:
            raise DryRunError(f"job {job}: uses {action}, which this run has no stand-in for")

    def verify(self) -> None:
        dist = self.artifacts / "dist"
        release = self.github / "releases" / self.tag
        built = sorted(p.name for p in dist.iterdir())
        got = sorted(p.name for p in release.iterdir()) if release.is_dir() else []
        missing = sorted(set(built) - set(got))
        if missing or "layers.json" not in got:
            raise DryRunError(f"the GitHub release {self.tag} lacks {missing + (['layers.json'] if 'layers.json' not in got else [])}")
        layers = json.loads((release / "layers.json").read_text())
        landed = {(e["region"], e["architecture"]): e["arn"] for e in layers["layers"]}
        want = {(r, a) for r in REGIONS.split(",") for a in ("x86_64", "arm64")}
        if set(landed) != want or layers["commit"] != self.sha:
            raise DryRunError(f"layers.json names {sorted(landed)} of commit {layers['commit']}, "
                              f"not {sorted(want)} of {self.sha}")
        calls = [json.loads(line) for line in (self.github / "calls.jsonl").read_text().splitlines()]
        prs = [c for c in calls if c["call"] == "pr create"]
        if len(prs) != 1:
            raise DryRunError(f"{len(prs)} pull requests opened, not one")
        branch = prs[0]["head"]
        page = git("show", f"refs/heads/{branch}:docs/src/reference/layers.md", cwd=self.work / "origin.git")
        unlisted = sorted(arn for arn in landed.values() if f"`{arn}`" not in page)
        if unlisted:
            raise DryRunError(f"the pull request's layers.md (branch {branch}) does not list {unlisted}")
        log(f"the GitHub release {self.tag} holds {len(got)} files (dist/ and layers.json); layers.json has "
            f"{len(REGIONS.split(','))} regions x 2 architectures; pull request {branch} lists them")


# --- sar-publish: what `sam publish` is stood in for ----------------------------------------------

def sar_publish(template: Path) -> int:
    """The checks `sam publish` makes before it calls SAR, and the code it would point SAR at."""
    import boto3
    from serverlessrepo.parser import get_app_metadata, parse_template

    t = parse_template(template.read_text())
    meta = get_app_metadata(t)
    meta.validate(["author", "description", "name", "semantic_version"])
    uris: list[str] = []
    for r in t.get("Resources", {}).values():
        for key in ("CodeUri", "ContentUri"):
            v = r.get("Properties", {}).get(key)
            if v is not None:
                uris.append(v if isinstance(v, str) else f"s3://{v['Bucket']}/{v['Key']}")
    for key in ("license_url", "readme_url"):
        if getattr(meta, key, None):
            uris.append(getattr(meta, key))
    s3 = boto3.client("s3")
    for uri in uris:
        u = urlparse(uri)
        if u.scheme != "s3":
            print(f"sar-publish: {template}: {uri} is not an S3 location (sam package it first)", file=sys.stderr)
            return 1
        size = s3.head_object(Bucket=u.netloc, Key=u.path.lstrip("/"))["ContentLength"]
        if size == 0:
            print(f"sar-publish: {uri} is empty", file=sys.stderr)
            return 1
    print(f"sar-publish (dry run): {meta.name} {t['Metadata']['AWS::ServerlessRepo::Application'].get('SemanticVersion')}: "
          f"metadata valid, {len(uris)} S3 objects in place; not published")
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="release/dry_run.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--work", type=Path, default=ROOT / "target" / "release-dry-run")
    p.add_argument("--workflow", type=Path, default=WORKFLOW)
    p = sub.add_parser("sar-publish")
    p.add_argument("--template", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "sar-publish":
        return sar_publish(a.template)
    a.work.mkdir(parents=True, exist_ok=True)
    try:
        Run(a.work.resolve(), a.workflow).run()
    except (DryRunError, subprocess.TimeoutExpired) as e:
        print(f"dry-run: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
