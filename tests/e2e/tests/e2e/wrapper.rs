//! The layer's exec wrapper (`/opt/flightlock-wrapper`): points the runtime at the proxy and
//! execs it with its arguments unchanged.

use std::process::Command;

use flightlock_e2e::repo_root;

fn wrapper(port: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(repo_root().join("extension/layer/flightlock-wrapper"));
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001");
    if let Some(p) = port {
        cmd.env("FLIGHTLOCK_PROXY_PORT", p);
    }
    cmd.output().unwrap()
}

#[test]
fn points_the_runtime_at_the_proxy_and_keeps_the_arguments() {
    let script = r#"printf '%s|' "$AWS_LAMBDA_RUNTIME_API" "$@""#;
    let out = wrapper(None, &["sh", "-c", script, "sh", "a b", "", "*"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "127.0.0.1:9009|a b||*|"
    );
    let out = wrapper(Some("19009"), &["sh", "-c", script, "sh"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "127.0.0.1:19009|");
}

#[test]
fn a_bad_port_or_no_command_is_refused_with_a_message() {
    for port in ["abc", "0", "70000", "-1"] {
        let out = wrapper(Some(port), &["true"]);
        assert!(!out.status.success(), "{port}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("FLIGHTLOCK_PROXY_PORT") && err.contains("1-65535"),
            "{err}"
        );
    }
    let out = wrapper(None, &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no runtime command"));
}
