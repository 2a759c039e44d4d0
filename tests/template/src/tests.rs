#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use flightlock::schema;
use flightlock_cleanup::config as cleanup_config;
use serde_yaml::Value;

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
fn cleanup_may_scan_and_delete_exactly_what_the_sweeper_calls() {
    let t = template();
    let root = repo_root();
    let mut files = vec![root.join("lock/src/sweep.rs")];
    files.extend(rust_files(&root.join("lock/src/sweep"), &[]));
    files.extend(rust_files(&root.join("functions/cleanup/src"), &[]));
    let required = required_by_files(&files).unwrap();
    assert_eq!(required, set(&["dynamodb:DeleteItem", "dynamodb:Scan"]));
    let granted =
        granted_actions(properties(&t, "CleanupFunction", FUNCTION).unwrap(), TABLE).unwrap();
    assert_eq!(granted, required, "cleanup IAM is not least privilege");
}

#[test]
fn lock_users_may_do_exactly_what_the_lock_code_calls() {
    let t = template();
    let root = repo_root();
    let lock_src = root.join("lock/src");
    // The lock as a lock user runs it: everything but the sweeper, the table admin helpers
    // (reached only through `table::...` calls, which required_actions follows) and the CLI.
    let skip = [
        lock_src.join("sweep.rs"),
        lock_src.join("sweep"),
        lock_src.join("table.rs"),
        lock_src.join("bin"),
    ];
    let skip: Vec<&Path> = skip.iter().map(|p| p.as_path()).collect();
    let mut files = rust_files(&lock_src, &skip);
    files.extend(rust_files(&root.join("extension/src"), &[]));
    files.extend(rust_files(&root.join("functions/demo-rust/src"), &[]));
    let required = required_by_files(&files).unwrap();
    // The protocol: one consistent Query to read, TransactWriteItems (Update counter + Put row)
    // to enqueue, UpdateItem to heartbeat, DeleteItem to release and to remove dead rows.
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
        let granted = granted_actions(properties(&t, job, FUNCTION).unwrap(), TABLE).unwrap();
        assert_eq!(
            granted, required,
            "{job}: IAM differs from what the code calls"
        );
    }
}

#[test]
fn every_flightlock_variable_set_is_read_by_the_code() {
    let t = template();
    for job in ["DemoPythonJob", "DemoRustJob"] {
        let vars = flightlock_variables(properties(&t, job, FUNCTION).unwrap());
        assert!(vars.contains(flightlock::config::TABLE), "{job}");
        for v in vars {
            assert!(
                flightlock::config::KNOWN.contains(&v.as_str()),
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
        assert_eq!(p["ContentUri"].as_str(), Some("."));
        assert_eq!(p["CompatibleArchitectures"][0].as_str(), Some(arch));
        let meta = &t["Resources"][name]["Metadata"];
        assert_eq!(meta["BuildMethod"].as_str(), Some("makefile"));
        assert_eq!(meta["BuildArchitecture"].as_str(), Some(arch));
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
        "FlightlockLayerX86Arn",
        "FlightlockLayerArm64Arn",
    ] {
        assert!(outputs.contains_key(o), "output {o} missing");
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
    let ok: Value = serde_yaml::from_str(
        "Policies:\n  - Statement:\n      - Effect: Allow\n        Action: [dynamodb:Scan]\n        Resource: !GetAtt LockTable.Arn\n",
    )
    .unwrap();
    assert_eq!(
        granted_actions(&ok, TABLE).unwrap(),
        set(&["dynamodb:Scan"])
    );
    for bad in [
        "Policies:\n  - Statement:\n      - Effect: Allow\n        Action: dynamodb:*\n        Resource: !GetAtt LockTable.Arn\n",
        "Policies:\n  - Statement:\n      - Effect: Allow\n        Action: dynamodb:Scan\n        Resource: '*'\n",
        "Policies:\n  - DynamoDBCrudPolicy:\n      TableName: !Ref LockTable\n",
    ] {
        let v: Value = serde_yaml::from_str(bad).unwrap();
        assert!(granted_actions(&v, TABLE).is_err(), "{bad}");
    }
}
