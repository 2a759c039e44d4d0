//! The deploy and upgrade path (issue 35): what each `Deploy` choice creates, the SSM parameters
//! that hand the layer's ARNs and the table to functions (the names `release/publish.py` writes),
//! outputs exported only where no upgrade changes them, retained layer versions, and the
//! documented attach snippets in the form `scripts/check-template` validates
//! (`tests/template/consumer.yaml`).

use std::collections::{BTreeMap, BTreeSet};

use serde_yaml_ng::Value;

use crate::docs::{read, section};
use crate::{load_template, ref_name, repo_root};

fn template() -> Value {
    load_template(&repo_root().join("template.yaml")).unwrap()
}

/// The page that documents the three choices.
const PAGE: &str = "docs/src/getting-started/deploy.md";

/// A template parameter's value: `params`, else its default.
fn param<'a>(t: &'a Value, params: &'a BTreeMap<&str, &str>, name: &str) -> String {
    if let Some(v) = params.get(name) {
        return (*v).to_owned();
    }
    match &t["Parameters"][name]["Default"] {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => panic!("parameter {name}: no default ({other:?})"),
    }
}

/// A condition's operand as a string: a literal or `!Ref` of a parameter.
fn operand(t: &Value, params: &BTreeMap<&str, &str>, v: &Value) -> String {
    match (ref_name(v), v) {
        (Some(name), _) => param(t, params, name),
        (None, Value::String(s)) => s.clone(),
        (None, Value::Bool(b)) => b.to_string(),
        (None, other) => panic!("operand {other:?}"),
    }
}

/// Evaluates a condition expression (`!Equals`, `!Not`, `!And`, `!Or`, `!Condition`, the short
/// forms this template uses) for `params`.
fn holds(t: &Value, params: &BTreeMap<&str, &str>, expr: &Value) -> bool {
    let Value::Tagged(tv) = expr else {
        panic!("a condition that is not a short-form function: {expr:?}")
    };
    let args = || tv.value.as_sequence().unwrap().iter();
    match tv.tag.to_string().trim_start_matches('!') {
        "Equals" => {
            let v: Vec<String> = args().map(|a| operand(t, params, a)).collect();
            v[0] == v[1]
        }
        "Not" => !holds(t, params, &tv.value[0]),
        "And" => args().all(|a| holds(t, params, a)),
        "Or" => args().any(|a| holds(t, params, a)),
        "Condition" => condition(t, params, tv.value.as_str().unwrap()),
        other => panic!("condition function {other}"),
    }
}

fn condition(t: &Value, params: &BTreeMap<&str, &str>, name: &str) -> bool {
    let expr = &t["Conditions"][name];
    assert!(!expr.is_null(), "no condition {name}");
    holds(t, params, expr)
}

/// The resources (or outputs) of `section` that exist for `params`.
fn present(t: &Value, section: &str, params: &BTreeMap<&str, &str>) -> BTreeSet<String> {
    t[section]
        .as_mapping()
        .unwrap()
        .iter()
        .filter(|(_, r)| {
            r["Condition"]
                .as_str()
                .is_none_or(|c| condition(t, params, c))
        })
        .map(|(k, _)| k.as_str().unwrap().to_owned())
        .collect()
}

/// The names a value refers to: `!Ref X`, `!GetAtt X.Attr`, `${X}` and `${X.Attr}` in `!Sub`.
/// Branches of `!If` whose condition is false for `params` are skipped.
fn references(t: &Value, params: &BTreeMap<&str, &str>, v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Tagged(tv) => {
            match tv.tag.to_string().trim_start_matches('!') {
                "Ref" => {
                    out.insert(tv.value.as_str().unwrap().to_owned());
                }
                "GetAtt" => {
                    let s = tv.value.as_str().unwrap();
                    out.insert(s.split('.').next().unwrap().to_owned());
                }
                "Sub" => {
                    let text = match &tv.value {
                        Value::String(s) => s.as_str(),
                        Value::Sequence(s) => s[0].as_str().unwrap(),
                        other => panic!("Sub {other:?}"),
                    };
                    // The list form's own variables ({Version: ...}) are not references.
                    let local = match &tv.value {
                        Value::Sequence(s) => s[1].as_mapping().cloned().unwrap_or_default(),
                        _ => Default::default(),
                    };
                    for part in text.split("${").skip(1) {
                        let name = part.split('}').next().unwrap();
                        if !name.starts_with('!') && !local.contains_key(name) {
                            out.insert(name.split('.').next().unwrap().to_owned());
                        }
                    }
                }
                "If" => {
                    let s = tv.value.as_sequence().unwrap();
                    let branch = if condition(t, params, s[0].as_str().unwrap()) {
                        &s[1]
                    } else {
                        &s[2]
                    };
                    references(t, params, branch, out);
                    return;
                }
                _ => {}
            }
            references(t, params, &tv.value, out);
        }
        Value::Mapping(m) => m.values().for_each(|c| references(t, params, c, out)),
        Value::Sequence(s) => s.iter().for_each(|c| references(t, params, c, out)),
        _ => {}
    }
}

/// What each choice must create, as the deploy page says (besides the example jobs).
const LAYER_PART: &[&str] = &[
    "FlightlockLayerX86",
    "FlightlockLayerArm64",
    "FlightlockLayerX86Parameter",
    "FlightlockLayerArm64Parameter",
    "FlightlockLayerX86VersionParameter",
    "FlightlockLayerArm64VersionParameter",
];
const TABLE_PART: &[&str] = &[
    "LockTable",
    "LockTableNameParameter",
    "LockTableStackParameter",
    "LockUserPolicy",
    "LockUserPolicyParameter",
    "CleanupFunction",
    "UnenforcedInvocationsAlarm",
    "LockLostAlarm",
    "LockErrorsAlarm",
    "RecordLockLostAlarm",
    "RecordLockErrorsAlarm",
    "SweepIncompleteAlarm",
    "SweepErrorsAlarm",
    "FlightlockDashboard",
];

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn each_deploy_choice_creates_its_part_and_refers_only_to_what_it_creates() {
    let t = template();
    let allowed: Vec<&str> = t["Parameters"]["Deploy"]["AllowedValues"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(allowed, ["all", "layer", "table"]);
    assert_eq!(t["Parameters"]["Deploy"]["Default"].as_str(), Some("all"));
    let parameters: BTreeSet<String> = t["Parameters"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap().to_owned())
        .collect();
    for (deploy, jobs, want) in [
        ("all", "false", [LAYER_PART, TABLE_PART].concat()),
        ("layer", "false", LAYER_PART.to_vec()),
        ("table", "false", TABLE_PART.to_vec()),
        (
            "all",
            "true",
            [LAYER_PART, TABLE_PART, &["DemoPythonJob", "DemoRustJob"]].concat(),
        ),
        // The example jobs need both parts: asking for them with one part creates none.
        ("layer", "true", LAYER_PART.to_vec()),
        ("table", "true", TABLE_PART.to_vec()),
    ] {
        let params = BTreeMap::from([("Deploy", deploy), ("ExampleJobs", jobs)]);
        let resources = present(&t, "Resources", &params);
        assert_eq!(
            resources,
            names(&want),
            "Deploy={deploy} ExampleJobs={jobs}"
        );
        // Everything that exists refers only to what exists (or to parameters and pseudo
        // parameters): a stack of one part deploys.
        for sec in ["Resources", "Outputs"] {
            for name in present(&t, sec, &params) {
                let mut refs = BTreeSet::new();
                references(&t, &params, &t[sec][name.as_str()], &mut refs);
                for r in refs {
                    assert!(
                        resources.contains(&r)
                            || parameters.contains(&r)
                            || r.starts_with("AWS::"),
                        "Deploy={deploy}: {sec} {name} refers to {r}, which this choice does not create"
                    );
                }
            }
        }
    }
}

#[test]
fn the_deploy_page_documents_each_choice() {
    let doc = read(PAGE);
    let part = section(&doc, "## Deploy only what you need").join("\n");
    for deploy in ["all", "layer", "table"] {
        assert!(part.contains(&format!("`Deploy={deploy}`")), "{deploy}");
    }
    for name in LAYER_PART.iter().chain(TABLE_PART) {
        assert!(part.contains(&format!("`{name}`")), "{PAGE}: {name}");
    }
    assert!(
        part.contains("once"),
        "{PAGE}: what an account owner does once"
    );
}

/// `SSM_PREFIX` of release/publish.py: where the publisher writes released layers' ARNs.
fn publisher_prefix() -> String {
    let publish = read("release/publish.py");
    publish
        .lines()
        .find_map(|l| l.strip_prefix("SSM_PREFIX = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("SSM_PREFIX in release/publish.py")
        .to_owned()
}

/// The SSM parameters the template writes: name (with the default prefix and the Release
/// mapping's version) → the resource its value is `!Ref` of.
fn ssm_parameters(t: &Value) -> BTreeMap<String, String> {
    let prefix = t["Parameters"]["ParameterPrefix"]["Default"]
        .as_str()
        .unwrap();
    let version = t["Mappings"]["Release"]["flightlock"]["Version"]
        .as_str()
        .expect("template.yaml: Mappings.Release.flightlock.Version");
    let mut out = BTreeMap::new();
    for (name, r) in t["Resources"].as_mapping().unwrap() {
        if r["Type"].as_str() != Some("AWS::SSM::Parameter") {
            continue;
        }
        let name = name.as_str().unwrap();
        let p = &r["Properties"];
        let Value::Tagged(sub) = &p["Name"] else {
            panic!("{name}: Name is not a !Sub")
        };
        // The prefix and fixed words, or the release's version as ${Version} from the Release
        // mapping (nothing else that changes with the stack's contents).
        let (text, versioned) = match &sub.value {
            Value::String(s) => (s.as_str(), false),
            Value::Sequence(s) => {
                let vars = s[1].as_mapping().unwrap();
                assert_eq!(vars.len(), 1, "{name}: {vars:?}");
                let Value::Tagged(find) = &s[1]["Version"] else {
                    panic!("{name}: ${{Version}} is not !FindInMap")
                };
                assert_eq!(find.tag, "FindInMap", "{name}");
                let path: Vec<&str> = find
                    .value
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap())
                    .collect();
                assert_eq!(path, ["Release", "flightlock", "Version"], "{name}");
                (s[0].as_str().unwrap(), true)
            }
            other => panic!("{name}: Name {other:?}"),
        };
        let rest = text
            .strip_prefix("${ParameterPrefix}/")
            .unwrap_or_else(|| panic!("{name}: {text} does not start with the prefix"));
        let rest = if versioned {
            rest.strip_suffix("/${Version}")
                .map(|r| format!("{r}/{version}"))
                .unwrap_or_else(|| panic!("{name}: {text} does not end with /${{Version}}"))
        } else {
            rest.to_owned()
        };
        assert!(!rest.contains('$'), "{name}: {text}");
        assert_eq!(p["Type"].as_str(), Some("String"), "{name}");
        for policy in ["DeletionPolicy", "UpdateReplacePolicy"] {
            let got = serde_yaml_ng::to_string(&r[policy]).unwrap();
            let want = if versioned {
                // Replaced each release: the previous release's name stays for the functions
                // still pinned to it.
                "Retain"
            } else if rest.starts_with("table/name") || rest.starts_with("table/stack") {
                // Kept with the table, so a table part turned off and on is refused.
                "!Ref TableDeletionPolicy"
            } else {
                // A fixed name that is deleted with its part: an orphan would block a later deploy.
                "null"
            };
            assert_eq!(got.trim(), want, "{name}: {policy}");
        }
        let value = ref_name(&p["Value"]).unwrap_or_else(|| panic!("{name}: Value"));
        out.insert(format!("{prefix}/{rest}"), value.to_owned());
    }
    out
}

#[test]
fn functions_find_the_layer_and_the_table_in_ssm_under_the_publishers_names() {
    let t = template();
    let publisher = publisher_prefix();
    let params = ssm_parameters(&t);
    let want = BTreeMap::from([
        (
            format!("{publisher}/x86_64/latest"),
            "FlightlockLayerX86".to_owned(),
        ),
        (
            format!("{publisher}/arm64/latest"),
            "FlightlockLayerArm64".to_owned(),
        ),
        (
            format!("{publisher}/x86_64/{}", env!("CARGO_PKG_VERSION")),
            "FlightlockLayerX86".to_owned(),
        ),
        (
            format!("{publisher}/arm64/{}", env!("CARGO_PKG_VERSION")),
            "FlightlockLayerArm64".to_owned(),
        ),
        ("/flightlock/table/name".to_owned(), "LockTable".to_owned()),
        (
            "/flightlock/table/stack".to_owned(),
            "AWS::StackId".to_owned(),
        ),
        (
            "/flightlock/table/lock-user-policy".to_owned(),
            "LockUserPolicy".to_owned(),
        ),
    ]);
    assert_eq!(params, want);
    for (arch, layer) in [
        ("x86_64", "FlightlockLayerX86"),
        ("arm64", "FlightlockLayerArm64"),
    ] {
        let p = &t["Resources"][layer]["Properties"];
        assert_eq!(p["CompatibleArchitectures"][0].as_str(), Some(arch));
        // Functions not yet moved to a new version still run the old one.
        assert_eq!(p["RetentionPolicy"].as_str(), Some("Retain"), "{layer}");
    }
}

#[test]
fn only_values_no_upgrade_changes_are_exported() {
    let t = template();
    let outputs = t["Outputs"].as_mapping().unwrap();
    let mut exported = BTreeSet::new();
    for (name, output) in outputs {
        let name = name.as_str().unwrap();
        let mut refs = BTreeSet::new();
        references(&t, &BTreeMap::new(), &output["Value"], &mut refs);
        let layer = refs.iter().any(|r| {
            t["Resources"][r.as_str()]["Type"].as_str() == Some("AWS::Serverless::LayerVersion")
        });
        let export = &output["Export"]["Name"];
        if layer {
            // A new ARN at every build: an import of it would block every upgrade.
            assert!(
                export.is_null(),
                "output {name} exports a layer version ARN"
            );
            continue;
        }
        if export.is_null() {
            continue;
        }
        assert!(
            matches!(export, Value::Tagged(s) if s.tag == "Sub"
                && s.value.as_str() == Some(format!("${{AWS::StackName}}-{name}").as_str())),
            "output {name}: export {export:?}"
        );
        exported.insert(name.to_owned());
    }
    assert_eq!(
        exported,
        names(&[
            "LockTableName",
            "LockTableArn",
            "LockUserPolicyArn",
            "CleanupFunctionName"
        ])
    );
}

/// The consumer stack `scripts/check-template` runs through cfn-lint, `sam validate --lint` and
/// `sam build`: every attach form the docs show.
const CONSUMER: &str = "tests/template/consumer.yaml";

/// The attach values of a YAML value: `Layers` entries, `FLIGHTLOCK_TABLE` values, and entries of
/// `Policies` and `ManagedPolicyArns` that are flightlock's, each as its YAML text.
fn attach_values(v: &Value, out: &mut Vec<(String, String)>) {
    let text = |v: &Value| serde_yaml_ng::to_string(v).unwrap().trim().to_owned();
    match v {
        Value::Mapping(m) => {
            for (k, child) in m {
                match k.as_str() {
                    Some("Layers") => {
                        for l in child.as_sequence().unwrap() {
                            out.push(("Layers".into(), text(l)));
                        }
                    }
                    Some("FLIGHTLOCK_TABLE") => out.push(("FLIGHTLOCK_TABLE".into(), text(child))),
                    Some("Policies" | "ManagedPolicyArns") => {
                        for p in child.as_sequence().into_iter().flatten() {
                            let s = text(p);
                            if s.contains("flightlock") {
                                out.push(("policy".into(), s));
                            }
                        }
                    }
                    _ => {}
                }
                attach_values(child, out);
            }
        }
        Value::Sequence(s) => s.iter().for_each(|c| attach_values(c, out)),
        Value::Tagged(tv) => attach_values(&tv.value, out),
        _ => {}
    }
}

/// Why an attach value is wrong, if it is: a layer must come from an SSM parameter the template
/// (or the publisher) writes, or a SAR application's output; nothing may import a layer ARN.
fn attach_problem(kind: &str, value: &str, ssm: &BTreeMap<String, String>) -> Option<String> {
    if value.contains("ImportValue") && kind == "Layers" {
        return Some("imports a layer ARN (blocks every upgrade)".into());
    }
    if let Some(rest) = value.split("{{resolve:ssm:").nth(1) {
        let name = rest.split("}}").next().unwrap();
        // An optional pinned version: NAME:VERSION.
        let name = match name.rsplit_once(':') {
            Some((n, v)) if v.chars().all(|c| c.is_ascii_digit()) => n,
            _ => name,
        };
        let Some(resource) = ssm.get(name) else {
            return Some(format!("{name} is not a parameter the template writes"));
        };
        let want = match kind {
            "Layers" => resource.starts_with("FlightlockLayer"),
            "FLIGHTLOCK_TABLE" => resource == "LockTable",
            _ => resource == "LockUserPolicy",
        };
        return (!want).then(|| format!("{name} holds {resource}, not what {kind} needs"));
    }
    if kind == "Layers" && !value.contains(".Outputs.LayerVersionArn") {
        return Some("a layer that is neither an SSM parameter nor a SAR output".into());
    }
    None
}

#[test]
fn attach_problem_tells_the_forms_apart() {
    let ssm = ssm_parameters(&template());
    for ok in [
        (
            "Layers",
            "'{{resolve:ssm:/flightlock/layer/x86_64/latest}}'",
        ),
        (
            "Layers",
            "'{{resolve:ssm:/flightlock/layer/arm64/latest:3}}'",
        ),
        ("Layers", "'{{resolve:ssm:/flightlock/layer/x86_64/0.1.0}}'"),
        ("Layers", "!GetAtt FlightlockLayer.Outputs.LayerVersionArn"),
        (
            "FLIGHTLOCK_TABLE",
            "'{{resolve:ssm:/flightlock/table/name}}'",
        ),
        (
            "policy",
            "'{{resolve:ssm:/flightlock/table/lock-user-policy}}'",
        ),
    ] {
        assert_eq!(attach_problem(ok.0, ok.1, &ssm), None, "{ok:?}");
    }
    for bad in [
        ("Layers", "!ImportValue flightlock-FlightlockLayerX86Arn"),
        ("Layers", "'{{resolve:ssm:/flightlock/layer/x86_64/0.0.9}}'"),
        ("Layers", "'{{resolve:ssm:/flightlock/table/name}}'"),
        ("Layers", "'{{resolve:ssm:/flightlock/table/stack}}'"),
        ("Layers", "arn:aws:lambda:eu-west-1:123456789012:layer:x:1"),
        (
            "FLIGHTLOCK_TABLE",
            "'{{resolve:ssm:/flightlock/layer/x86_64/latest}}'",
        ),
    ] {
        assert!(attach_problem(bad.0, bad.1, &ssm).is_some(), "{bad:?}");
    }
}

#[test]
fn every_documented_attach_snippet_is_a_form_the_consumer_stack_validates() {
    let t = template();
    let ssm = ssm_parameters(&t);
    let consumer = load_template(&repo_root().join(CONSUMER)).unwrap();
    let mut validated = Vec::new();
    attach_values(&consumer, &mut validated);
    assert!(validated.len() >= 6, "{validated:?}");
    for (kind, value) in &validated {
        assert_eq!(
            attach_problem(kind, value, &ssm),
            None,
            "{CONSUMER}: {kind} {value}"
        );
    }
    let validated: BTreeSet<&(String, String)> = validated.iter().collect();
    let mut seen = 0;
    for file in crate::params::doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (lang, body, after) in crate::lists::code_blocks(&text) {
            if lang != "yaml" {
                continue;
            }
            let at = format!("{}:{after}", file.display());
            let doc: Value = serde_yaml_ng::from_str(&body).unwrap_or_else(|e| panic!("{at}: {e}"));
            let mut found = Vec::new();
            attach_values(&doc, &mut found);
            for (kind, value) in found {
                // SAR (layers.md) is its own form, checked by release/tests; a table or policy
                // named outright is the user's own.
                let reference = value.contains("{{resolve") || value.contains("ImportValue");
                if value.contains(".Outputs.LayerVersionArn") || (kind != "Layers" && !reference) {
                    continue;
                }
                seen += 1;
                if let Some(p) = attach_problem(&kind, &value, &ssm) {
                    panic!("{at}: {kind} {value}: {p}");
                }
                assert!(
                    validated.contains(&(kind.clone(), value.clone())),
                    "{at}: {kind} {value} is not a form {CONSUMER} validates (add it there)"
                );
            }
        }
    }
    assert!(seen >= 6, "only {seen} attach values in the docs");
}

#[test]
fn the_partial_builds_the_page_gives_are_the_ones_check_sam_build_runs() {
    let doc = read(PAGE);
    let script = read("scripts/check-sam-build");
    let mut builds = 0;
    for line in doc.lines() {
        let Some(overrides) = line.strip_prefix("scripts/sam build --parameter-overrides ") else {
            continue;
        };
        let Some(part) = overrides.strip_prefix("Deploy=") else {
            continue;
        };
        builds += 1;
        // check-sam-build adds the architecture of this machine's Rust functions to the same words.
        assert!(
            script.contains(&format!(
                "\npart_build {part} --parameter-overrides \"{overrides} FunctionArchitecture="
            )),
            "{PAGE}: `scripts/sam build --parameter-overrides {overrides}` is not what scripts/check-sam-build builds for the {part} part"
        );
    }
    assert_eq!(builds, 2, "{PAGE}: the layer's and the table's builds");
    // The defaults' build (no parameter) is checked too: both parts, no example job.
    assert!(
        doc.lines().any(|l| l == "scripts/sam build"),
        "{PAGE}: no build with the defaults"
    );
    assert!(script.contains("\npart_build default --parameter-overrides \"FunctionArchitecture="));
}
