#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use flightlock::schema;
use flightlock_cleanup::config as cleanup_config;
use serde_yaml_ng::Value;

use super::*;

const TABLE: &str = "LockTable";
const FUNCTION: &str = "AWS::Serverless::Function";
const LAYER: &str = "AWS::Serverless::LayerVersion";

fn template() -> Value {
    load_template(&repo_root().join("template.yaml")).unwrap()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn table_has_the_schema_the_code_uses() {
    let t = template();
    let table = properties(&t, TABLE, "AWS::DynamoDB::Table").unwrap();
    assert_eq!(table["BillingMode"].as_str(), Some("PAY_PER_REQUEST"));
    let keys: Vec<(&str, &str)> = table["KeySchema"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["AttributeName"].as_str().unwrap(),
                k["KeyType"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(keys, [(schema::PK, "HASH"), (schema::SK, "RANGE")]);
    let attrs: BTreeSet<(String, String)> = table["AttributeDefinitions"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["AttributeName"].as_str().unwrap().to_owned(),
                a["AttributeType"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        attrs,
        BTreeSet::from([
            (schema::PK.to_owned(), "S".to_owned()),
            (schema::SK.to_owned(), "S".to_owned())
        ])
    );
    let ttl = &table["TimeToLiveSpecification"];
    assert_eq!(ttl["AttributeName"].as_str(), Some(schema::EXPIRES_AT));
    assert_eq!(ttl["Enabled"].as_bool(), Some(true));
    assert!(
        !table["PointInTimeRecoverySpecification"].is_null(),
        "PITR must be configurable"
    );
    assert!(!t["Parameters"]["PointInTimeRecovery"].is_null());
}

#[test]
fn table_is_retained_on_stack_deletion_unless_the_parameter_says_delete() {
    let t = template();
    let param = &t["Parameters"]["TableDeletionPolicy"];
    assert_eq!(param["Default"].as_str(), Some("Retain"));
    let allowed: Vec<&str> = param["AllowedValues"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(allowed, ["Retain", "Delete"]);
    let table = &t["Resources"][TABLE];
    for policy in ["DeletionPolicy", "UpdateReplacePolicy"] {
        assert_eq!(
            ref_name(&table[policy]),
            Some("TableDeletionPolicy"),
            "{policy}"
        );
    }
    // A Ref in DeletionPolicy is only resolved by the AWS::LanguageExtensions transform, which
    // must run before the SAM transform.
    let transforms: Vec<&str> = t["Transform"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        transforms,
        ["AWS::LanguageExtensions", "AWS::Serverless-2016-10-31"]
    );
    // Retained tables are protected from deletion by hand too.
    let protection = &table["Properties"]["DeletionProtectionEnabled"];
    assert!(
        matches!(protection, Value::Tagged(tv) if tv.tag == "If"
            && tv.value[0].as_str() == Some("RetainTable")
            && tv.value[1].as_bool() == Some(true)
            && tv.value[2].as_bool() == Some(false)),
        "{protection:?}"
    );
}

#[test]
fn example_jobs_are_off_unless_asked_for() {
    let t = template();
    assert_eq!(
        t["Parameters"]["ExampleJobs"]["Default"].as_str(),
        Some("false")
    );
    // ExampleJobs=true, and only with both parts (Deploy=all): the jobs use the layer and the
    // table.
    let condition = &t["Conditions"]["CreateExampleJobs"];
    let Value::Tagged(and) = condition else {
        panic!("{condition:?}")
    };
    assert_eq!(and.tag, "And", "{condition:?}");
    for (i, (param, value)) in [("ExampleJobs", "true"), ("Deploy", "all")]
        .into_iter()
        .enumerate()
    {
        assert!(
            matches!(&and.value[i], Value::Tagged(tv) if tv.tag == "Equals"
                && ref_name(&tv.value[0]) == Some(param)
                && tv.value[1].as_str() == Some(value)),
            "{condition:?}"
        );
    }
    for job in ["DemoPythonJob", "DemoRustJob"] {
        assert_eq!(
            t["Resources"][job]["Condition"].as_str(),
            Some("CreateExampleJobs"),
            "{job}"
        );
    }
    // Nothing unconditional may point at a conditional resource (the stack would not deploy).
    for o in t["Outputs"].as_mapping().unwrap().values() {
        let text = format!("{o:?}");
        assert!(!text.contains("DemoPythonJob") && !text.contains("DemoRustJob"));
    }
}

#[test]
fn cleanup_may_scan_and_delete_exactly_what_the_sweeper_calls() {
    let t = template();
    let root = repo_root();
    // The sweeper, and the two files of the DynamoDB shell it reaches: its Scan, and the removal
    // of a dead entry that waiters use too.
    let mut files = vec![
        root.join("lock/src/sweep.rs"),
        root.join("lock/src/storage/dynamo/scan.rs"),
        root.join("lock/src/storage/dynamo/removal.rs"),
    ];
    files.extend(rust_files(&root.join("lock/src/sweep"), &[]));
    files.extend(rust_files(&root.join("functions/cleanup/src"), &[]));
    let required = required_by_files(&files).unwrap();
    assert_eq!(
        required,
        set(&[
            "dynamodb:DeleteItem",
            "dynamodb:Scan",
            "dynamodb:UpdateItem"
        ])
    );
    let granted = granted_actions(
        &t,
        properties(&t, "CleanupFunction", FUNCTION).unwrap(),
        TABLE,
    )
    .unwrap();
    assert_eq!(granted, required, "cleanup IAM is not least privilege");
}

#[test]
fn lock_users_may_do_exactly_what_the_lock_code_calls() {
    let t = template();
    let root = repo_root();
    let lock_src = root.join("lock/src");
    // The lock as a lock user runs it: everything but the sweeper and its Scan, the table admin helpers
    // (reached only through `table::...` calls, which required_actions follows), the CLI and
    // the simulation (test code: it creates tables on DynamoDB Local).
    let skip = [
        lock_src.join("sweep.rs"),
        lock_src.join("sweep"),
        lock_src.join("storage/dynamo/scan.rs"),
        lock_src.join("table.rs"),
        lock_src.join("bin"),
        lock_src.join("sim"),
    ];
    let skip: Vec<&Path> = skip.iter().map(|p| p.as_path()).collect();
    let mut files = rust_files(&lock_src, &skip);
    files.extend(rust_files(&root.join("extension/src"), &[]));
    files.extend(rust_files(&root.join("functions/demo-rust/src"), &[]));
    let required = required_by_files(&files).unwrap();
    // The protocol: one consistent Query to read, TransactWriteItems (Update counter + Put row)
    // to enqueue, UpdateItem to take, heartbeat and vacate the counter's seat and to heartbeat
    // rows, DeleteItem to release and to remove dead rows.
    for a in [
        "dynamodb:Query",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
    ] {
        assert!(required.contains(a), "{a} not found in the lock's code");
    }
    assert!(!required.contains("dynamodb:Scan"), "lock users never scan");
    for job in ["DemoPythonJob", "DemoRustJob"] {
        let granted = granted_actions(&t, properties(&t, job, FUNCTION).unwrap(), TABLE).unwrap();
        assert_eq!(
            granted, required,
            "{job}: IAM differs from what the code calls"
        );
    }
    // The policy lock users attach is the same set, and it is an output.
    let policy = properties(&t, "LockUserPolicy", "AWS::IAM::ManagedPolicy").unwrap();
    let user: Value = serde_yaml_ng::from_str("Policies: [!Ref LockUserPolicy]").unwrap();
    assert_eq!(granted_actions(&t, &user, TABLE).unwrap(), required);
    assert_eq!(
        ref_name(&t["Outputs"]["LockUserPolicyArn"]["Value"]),
        Some("LockUserPolicy")
    );
    // With LockKeyPrefix set, every statement is limited to keys under it.
    for st in policy["PolicyDocument"]["Statement"].as_sequence().unwrap() {
        let Value::Tagged(cond) = &st["Condition"] else {
            panic!("statement without the key-prefix condition: {st:?}");
        };
        assert_eq!(cond.tag, "If");
        assert_eq!(cond.value[0].as_str(), Some("HasKeyPrefix"));
        let like = &cond.value[1]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"][0];
        assert!(
            matches!(like, Value::Tagged(s) if s.tag == "Sub" && s.value.as_str() == Some("${LockKeyPrefix}*")),
            "{like:?}"
        );
        assert_eq!(ref_name(&cond.value[2]), Some("AWS::NoValue"));
    }
}

#[test]
fn example_jobs_lock_keys_under_the_prefix_the_policy_allows() {
    let t = template();
    for job in ["DemoPythonJob", "DemoRustJob"] {
        let key = &properties(&t, job, FUNCTION).unwrap()["Environment"]["Variables"]
            [flightlock_lambda::config::KEY];
        let Value::Tagged(sub) = key else {
            panic!("{job}: FLIGHTLOCK_KEY is not a !Sub: {key:?}");
        };
        assert_eq!(sub.tag, "Sub", "{job}");
        let text = sub.value.as_str().unwrap();
        let rest = text.strip_prefix("${LockKeyPrefix}").unwrap_or_else(|| {
            panic!("{job}: FLIGHTLOCK_KEY {text} does not start with the prefix")
        });
        // A literal key: no template placeholders, no further substitutions.
        assert!(
            !rest.is_empty() && !rest.contains(['{', '}', '$']),
            "{job}: {text}"
        );
    }
}

#[test]
fn every_flightlock_variable_set_is_read_by_the_code() {
    let t = template();
    for job in ["DemoPythonJob", "DemoRustJob"] {
        let vars = flightlock_variables(properties(&t, job, FUNCTION).unwrap());
        assert!(vars.contains(flightlock_lambda::config::TABLE), "{job}");
        for v in vars {
            assert!(
                flightlock_lambda::config::KNOWN.contains(&v.as_str()),
                "{job} sets {v}, which flightlock does not read"
            );
        }
    }
    let cleanup = [
        cleanup_config::TABLE,
        cleanup_config::SWEEP_GRACE,
        cleanup_config::SWEEP_CONCURRENCY,
        cleanup_config::SWEEP_SEGMENTS,
        cleanup_config::SWEEP_MARGIN,
        cleanup_config::METRICS,
    ];
    let vars = flightlock_variables(properties(&t, "CleanupFunction", FUNCTION).unwrap());
    assert!(vars.contains(cleanup_config::TABLE));
    for v in vars {
        assert!(cleanup.contains(&v.as_str()), "cleanup sets unknown {v}");
    }
}

#[test]
fn every_example_job_is_actually_gated() {
    let t = template();
    // Python: the layer's wrapper puts the proxy in front of the runtime.
    let python = properties(&t, "DemoPythonJob", FUNCTION).unwrap();
    assert_eq!(
        python["Environment"]["Variables"]["AWS_LAMBDA_EXEC_WRAPPER"].as_str(),
        Some("/opt/flightlock-wrapper")
    );
    assert!(
        python["Layers"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|l| matches!(l, Value::Tagged(r) if r.tag == "Ref" && r.value.as_str() == Some("FlightlockLayerX86"))),
        "the Python job lacks the x86_64 layer"
    );
    // Rust on provided.al2023 runs no wrapper: the in-process layer must be switched on, and
    // the demo must read the switch.
    let rust = properties(&t, "DemoRustJob", FUNCTION).unwrap();
    assert_eq!(
        rust["Environment"]["Variables"]["DEMO_IN_PROCESS_LOCK"].as_str(),
        Some("1")
    );
    let main =
        std::fs::read_to_string(repo_root().join("functions/demo-rust/src/main.rs")).unwrap();
    assert!(main.contains("DEMO_IN_PROCESS_LOCK") && main.contains("FlightlockLayer"));
}

#[test]
fn layers_and_functions_carry_build_metadata_and_their_code_exists() {
    let t = template();
    for (name, arch) in [
        ("FlightlockLayerX86", "x86_64"),
        ("FlightlockLayerArm64", "arm64"),
    ] {
        let p = properties(&t, name, LAYER).unwrap();
        // A narrow ContentUri: SAM copies it to a scratch folder before running make, and `.`
        // would copy target/ and .tools/ (GBs). The Makefile is found through ContextPath and
        // builds in the repository itself.
        let content = p["ContentUri"].as_str().unwrap();
        assert_eq!(content, "extension/layer");
        let files: Vec<_> = std::fs::read_dir(repo_root().join(content))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(files, ["flightlock-wrapper"], "{content} must stay small");
        assert_eq!(p["CompatibleArchitectures"][0].as_str(), Some(arch));
        let meta = &t["Resources"][name]["Metadata"];
        assert_eq!(meta["BuildMethod"].as_str(), Some("makefile"));
        assert_eq!(meta["BuildArchitecture"].as_str(), Some(arch));
        assert_eq!(meta["ContextPath"].as_str(), Some("."));
        let makefile = std::fs::read_to_string(repo_root().join("Makefile")).unwrap();
        assert!(
            makefile.contains(&format!("\nbuild-{name}:")),
            "the Makefile has no target build-{name}"
        );
    }
    let root = repo_root();
    for (name, runtime, handler, code) in [
        (
            "CleanupFunction",
            "provided.al2023",
            "bootstrap",
            "functions/cleanup/Cargo.toml",
        ),
        (
            "DemoRustJob",
            "provided.al2023",
            "bootstrap",
            "functions/demo-rust/Cargo.toml",
        ),
        (
            "DemoPythonJob",
            "python3.12",
            "handler.handler",
            "functions/demo-python/handler.py",
        ),
    ] {
        let p = properties(&t, name, FUNCTION).unwrap();
        assert_eq!(p["Runtime"].as_str(), Some(runtime), "{name}");
        assert_eq!(p["Handler"].as_str(), Some(handler), "{name}");
        let code_uri = p["CodeUri"].as_str().unwrap();
        assert!(code.starts_with(code_uri), "{name}: CodeUri {code_uri}");
        assert!(root.join(code).is_file(), "{name}: {code} is missing");
        if runtime == "provided.al2023" {
            let meta = &t["Resources"][name]["Metadata"];
            assert_eq!(meta["BuildMethod"].as_str(), Some("rust-cargolambda"));
        }
        let schedule = p["Events"]
            .as_mapping()
            .unwrap()
            .values()
            .any(|e| e["Type"].as_str() == Some("Schedule"));
        assert!(schedule, "{name} has no Schedule event");
    }
    // Handler `module.function`: the module file defines the function.
    let python = properties(&t, "DemoPythonJob", FUNCTION).unwrap();
    let (module, function) = python["Handler"]
        .as_str()
        .and_then(|h| h.split_once('.'))
        .unwrap();
    let code_uri = python["CodeUri"].as_str().unwrap();
    let py = std::fs::read_to_string(root.join(code_uri).join(format!("{module}.py"))).unwrap();
    assert!(py.contains(&format!("def {function}(event, context)")));
    let outputs = t["Outputs"].as_mapping().unwrap();
    for o in [
        "LockTableName",
        "LockTableArn",
        "LockUserPolicyArn",
        "FlightlockLayerX86Arn",
        "FlightlockLayerArm64Arn",
    ] {
        assert!(outputs.contains_key(o), "output {o} missing");
    }
}

// Which outputs are exported: deploy.rs (`only_values_no_upgrade_changes_are_exported`).

#[test]
fn alarms_watch_metrics_the_code_emits_and_notify_the_optional_topic() {
    let t = template();
    // The extension's metric names, as the metrics module of the gate it shares with the
    // in-process layer spells them (`Metric::X => "X"`).
    let source = std::fs::read_to_string(repo_root().join("lambda/src/metrics.rs")).unwrap();
    let extension: BTreeSet<String> = source
        .lines()
        .filter_map(|l| l.split_once("=> \"")?.1.split_once('"'))
        .map(|(name, _)| name.to_owned())
        .collect();
    assert!(extension.contains("UnenforcedInvocations"), "{extension:?}");
    // The sweeper's, from the EMF document it prints.
    let emf = flightlock_cleanup::metrics::emf("t", &flightlock::SweepSummary::default(), 0);
    let sweeper: BTreeSet<String> = emf["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["Name"].as_str().unwrap().to_owned())
        .collect();

    let mut watched = BTreeSet::new();
    for (name, resource) in t["Resources"].as_mapping().unwrap() {
        if resource["Type"].as_str() != Some("AWS::CloudWatch::Alarm") {
            continue;
        }
        let name = name.as_str().unwrap();
        let alarm = &resource["Properties"];
        let (namespace, metric) = alarm_metric(alarm).unwrap();
        assert_eq!(namespace, "flightlock", "{name}");
        let known = if alarm["Dimensions"][0]["Name"].as_str() == Some("Table") {
            assert_eq!(ref_name(&alarm["Dimensions"][0]["Value"]), Some(TABLE));
            &sweeper
        } else {
            &extension
        };
        assert!(
            known.contains(&metric),
            "{name} watches {metric}, which nothing emits"
        );
        for actions in ["AlarmActions", "OKActions"] {
            let a = &alarm[actions];
            assert!(
                matches!(a, Value::Tagged(tv) if tv.tag == "If"
                    && tv.value[0].as_str() == Some("HasAlarmTopic")
                    && ref_name(&tv.value[1][0]) == Some("AlarmTopicArn")),
                "{name}: {actions} {a:?}"
            );
        }
        watched.insert(metric);
    }
    for metric in [
        "UnenforcedInvocations",
        "LockLost",
        "LockErrors",
        "RecordLockLost",
        "RecordLockErrors",
        "SweepIncomplete",
        "SweepErrors",
    ] {
        assert!(watched.contains(metric), "no alarm on {metric}");
    }
}

#[test]
fn template_passes_cfn_lint_and_sam_validate() {
    let out = Command::new(repo_root().join("scripts/check-template"))
        .output()
        .expect("running scripts/check-template");
    assert!(
        out.status.success(),
        "scripts/check-template failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// The checks' own logic, on small inputs: they must be able to fail.

#[test]
fn required_actions_reads_calls_and_transaction_parts() {
    let src = r#"
        // client.scan() in a comment is not a call
        client.query().send();
        let u = Update::builder(); let p = Put::builder();
        client.transact_write_items().send();
        flightlock::table::verify_table(&c, "t");
    "#;
    assert_eq!(
        required_actions(src).unwrap(),
        set(&[
            "dynamodb:DescribeTable",
            "dynamodb:DescribeTimeToLive",
            "dynamodb:PutItem",
            "dynamodb:Query",
            "dynamodb:UpdateItem",
        ])
    );
    assert!(required_actions("client.transact_write_items()").is_err());
}

#[test]
fn granted_actions_rejects_wildcards_and_other_resources() {
    let ok: Value = serde_yaml_ng::from_str(
        "Policies:\n  - Statement:\n      - Effect: Allow\n        Action: [dynamodb:Scan]\n        Resource: !GetAtt LockTable.Arn\n",
    )
    .unwrap();
    assert_eq!(
        granted_actions(&template(), &ok, TABLE).unwrap(),
        set(&["dynamodb:Scan"])
    );
    for bad in [
        "Policies:\n  - Statement:\n      - Effect: Allow\n        Action: dynamodb:*\n        Resource: !GetAtt LockTable.Arn\n",
        "Policies:\n  - Statement:\n      - Effect: Allow\n        Action: dynamodb:Scan\n        Resource: '*'\n",
        "Policies:\n  - DynamoDBCrudPolicy:\n      TableName: !Ref LockTable\n",
        "Policies:\n  - !Ref LockTable\n",
    ] {
        let v: Value = serde_yaml_ng::from_str(bad).unwrap();
        assert!(granted_actions(&template(), &v, TABLE).is_err(), "{bad}");
    }
}

#[test]
fn alarm_metric_reads_both_alarm_forms() {
    let plain: Value =
        serde_yaml_ng::from_str("Namespace: flightlock\nMetricName: SweepErrors\n").unwrap();
    assert_eq!(
        alarm_metric(&plain).unwrap(),
        ("flightlock".to_owned(), "SweepErrors".to_owned())
    );
    let query: Value = serde_yaml_ng::from_str(
        "Metrics:\n  - Id: a\n    Expression: SELECT SUM(LockLost) FROM SCHEMA(flightlock, FunctionName)\n",
    )
    .unwrap();
    assert_eq!(
        alarm_metric(&query).unwrap(),
        ("flightlock".to_owned(), "LockLost".to_owned())
    );
    for bad in [
        "Metrics:\n  - Id: a\n    Expression: SELECT SUM(*) FROM flightlock\n",
        "Metrics:\n  - Id: a\n    Expression: SELECT SUM(LockLost) FROM flightlock\n",
        "Threshold: 1\n",
    ] {
        let v: Value = serde_yaml_ng::from_str(bad).unwrap();
        assert!(alarm_metric(&v).is_err(), "{bad}");
    }
}
