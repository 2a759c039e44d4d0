//! The extension's memory while gating a 6 MB event with a key template: the key's field is
//! found by a streaming walk, so the peak stays near the event's own bytes (which the proxy
//! holds to hand them over) instead of the many-times-larger `serde_json::Value` tree. Prints
//! the peak RSS (VmHWM); run it with `--nocapture` to see the figure.

use flightlock_e2e::{finish, record_file, table, Env, Runtime, Spec};

/// VmHWM / VmRSS (kB) of the environment's extension, found in /proc by its name and proxy port.
fn extension_memory(env: &Env) -> (u64, u64) {
    let marker = format!("FLIGHTLOCK_PROXY_PORT={}", env.proxy_port);
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let dir = entry.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() != "flightlock" {
            continue;
        }
        let environ = std::fs::read(dir.join("environ")).unwrap_or_default();
        if !environ.split(|b| *b == 0).any(|e| e == marker.as_bytes()) {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap();
        let kb = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap()
        };
        return (kb("VmHWM:"), kb("VmRSS:"));
    }
    panic!("extension process of {} not found", env.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gating_a_6mb_event_with_a_key_template_keeps_the_extension_small() {
    let (endpoint, table) = table("e2e_memory").await;
    let record = record_file("memory");
    let spec = Spec::layered("memory", Runtime::Raw).with("FLIGHTLOCK_KEY", "acct-{/id}");
    let env = Env::start("memory", &spec, &endpoint, &table, &record).await;
    // Warm up (init, first lock) with a small event, then the 6 MB one: many small strings in
    // an array (the worst case for a Value tree), with the key's field at the very end.
    let small = br#"{"id":"warm"}"#.to_vec();
    std::fs::write(env.dir.join("response.bin"), b"{}").unwrap();
    assert_eq!(
        env.invoke_with(small, &[]).await.status,
        200,
        "{}",
        env.log()
    );
    let (hwm_before, _) = extension_memory(&env);
    let size = 6 * 1024 * 1024 - 4096;
    let mut event = Vec::with_capacity(size);
    event.extend_from_slice(b"{\"items\":[");
    while event.len() < size - 64 {
        event.extend_from_slice(b"\"abcdefgh\",");
    }
    event.extend_from_slice(b"\"end\"],\"id\":\"42\"}");
    let r = env.invoke_with(event.clone(), &[]).await;
    assert_eq!(r.status, 200, "{}", env.log());
    assert!(env.log().contains("acct-42"), "{}", env.log());
    // A key template with the default skip policy is warned about at init.
    assert!(
        env.log().contains(
            "reads the event and FLIGHTLOCK_ON_BUSY=skip answers a busy event as a success"
        ),
        "{}",
        env.log()
    );
    let (hwm, rss) = extension_memory(&env);
    println!(
        "extension memory, 6 MB event ({} bytes) with FLIGHTLOCK_KEY=acct-{{/id}}: peak RSS \
         (VmHWM) {:.1} MB (before the big event {:.1} MB), RSS after {:.1} MB",
        event.len(),
        hwm as f64 / 1024.0,
        hwm_before as f64 / 1024.0,
        rss as f64 / 1024.0
    );
    // A Value tree of this event alone would take well over 100 MB; the event's bytes are held
    // about twice (collected chunks, then one contiguous copy) while it is gated.
    assert!(
        hwm - hwm_before < 20 * 1024,
        "the big event raised the peak by {} kB",
        hwm - hwm_before
    );
    finish(env, &record).await;
}
