//! End-to-end: the flightlock layer (extension + wrapper) and the in-process layer in emulated
//! Lambda environments. See the crate docs for how to run them.

use std::time::{Duration, Instant};

use flightlock_e2e::{
    fifo_round, finish, record_file, runs, skip_rounds, start_all, stop_all, table, Env, Runtime,
    Spec,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_flight_skip_across_python_environments() {
    let (endpoint, table) = table("e2e_skip").await;
    let record = record_file("skip");
    let specs: Vec<Spec> = (0..4)
        .map(|_| Spec::layered("nightly", Runtime::Python).with("FLIGHTLOCK_WAIT", "0"))
        .collect();
    let envs = start_all("py", &specs, &endpoint, &table, &record).await;
    skip_rounds(&envs, &record, "nightly", 2000).await;
    for e in &envs {
        assert!(
            e.log().contains("\"Skipped\"") || e.log().contains("\"Acquired\""),
            "EMF metrics missing:\n{}",
            e.log()
        );
        assert!(!e.log().contains("UNENFORCED"), "{}", e.log());
    }
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_flight_fifo_with_wait_across_rust_and_python() {
    let (endpoint, table) = table("e2e_fifo").await;
    let record = record_file("fifo");
    let specs = vec![
        Spec::layered("report", Runtime::Rust).with("FLIGHTLOCK_WAIT", "forever"),
        Spec::layered("report", Runtime::Python).with("FLIGHTLOCK_WAIT", "forever"),
        Spec::layered("report", Runtime::Rust).with("FLIGHTLOCK_WAIT", "forever"),
        Spec::layered("report", Runtime::Python).with("FLIGHTLOCK_WAIT", "forever"),
    ];
    let envs = start_all("mix", &specs, &endpoint, &table, &record).await;
    fifo_round(&envs, &record).await;
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_layer_single_flight_for_rust() {
    let (endpoint, table) = table("e2e_inproc").await;
    let record = record_file("inproc");
    let specs: Vec<Spec> = (0..3)
        .map(|_| Spec {
            extension: false,
            wrapper: false,
            ..Spec::layered("inproc", Runtime::RustInProcess)
        })
        .collect();
    let envs = start_all("rs", &specs, &endpoint, &table, &record).await;
    skip_rounds(&envs, &record, "inproc", 2000).await;
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_crash_and_timeout_release_the_lock() {
    let (endpoint, table) = table("e2e_fail").await;
    let record = record_file("fail");
    // Lease 10 s: a lock that was not released would hold the key for longer than any wait here
    // (the wait is capped at the 6 s timeout minus the 1 s margin).
    let spec = Spec {
        timeout_secs: 6,
        ..Spec::layered("fragile", Runtime::Python)
            .with("FLIGHTLOCK_WAIT", "forever")
            .with("FLIGHTLOCK_LEASE", "10s")
    };
    let env = Env::start("fail", &spec, &endpoint, &table, &record).await;
    let ok = env.invoke(json!({"seq": 0})).await;
    assert_eq!(ok.json()["ok"], true, "{}", env.log());

    // A handler error: the error reaches the caller and the lock is released with the answer.
    // No stopwatch (these machines are noisy): a lock left held would outlast the next
    // invocation's whole wait (lease 10 s, wait capped at 5 s), which would then fail.
    let r = env.invoke(json!({"seq": 1, "mode": "error"})).await;
    assert_eq!(r.json()["errorType"], "RuntimeError", "{:?}", r.body);
    assert_eq!(env.invoke(json!({"seq": 2})).await.json()["ok"], true);

    // A timeout: Lambda resets the sandbox; the lock is released by whichever comes first, the
    // SHUTDOWN event or the extension seeing the killed runtime exit.
    let r = env.invoke(json!({"seq": 3, "mode": "timeout"})).await;
    assert!(
        String::from_utf8_lossy(&r.body).contains("timed out"),
        "{:?}",
        r.body
    );
    let until = Instant::now() + Duration::from_secs(3);
    while ![
        "released held locks at shutdown",
        "the runtime exited in the middle",
    ]
    .iter()
    .any(|m| env.log().contains(m))
    {
        assert!(Instant::now() < until, "not released:\n{}", env.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        env.invoke(json!({"seq": 4})).await.json()["ok"],
        true,
        "{}",
        env.log()
    );

    // A crash: the lock is released at once, by the extension seeing the runtime's process tree
    // die or by the SHUTDOWN that follows the crash, whichever comes first (Lambda then resets
    // the sandbox, extension included), so the next invocation runs.
    let exits = |log: String| {
        log.matches("the runtime exited in the middle of the invocation")
            .count()
            + log.matches("released held locks at shutdown").count()
    };
    let exits_before = exits(env.log());
    let r = env.invoke(json!({"seq": 5, "mode": "crash"})).await;
    assert!(
        String::from_utf8_lossy(&r.body).contains("Runtime.ExitError"),
        "{:?}",
        r.body
    );
    // As above, the next invocation can only run if the lock was released well before its
    // 10 s lease ended; the log says by which of the two.
    assert_eq!(
        env.invoke(json!({"seq": 6})).await.json()["ok"],
        true,
        "{}",
        env.log()
    );
    assert!(exits(env.log()) > exits_before, "{}", env.log());

    let runs = runs(&record);
    let seqs: Vec<i64> = runs.iter().map(|r| r.seq.unwrap()).collect();
    assert_eq!(seqs, vec![0, 1, 2, 3, 4, 5, 6]);
    finish(env, &record).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_event_and_response_are_byte_identical_and_headers_kept() {
    let (endpoint, table) = table("e2e_big").await;
    let record = record_file("big");
    for stream in [false, true] {
        let mut spec = Spec::layered("big", Runtime::Raw);
        if stream {
            // RIE logs the response mode at debug level: the test checks streaming was used.
            spec = spec.with("RAW_STREAM", "1").with("LOG_LEVEL", "debug");
        }
        let env = Env::start(
            if stream { "stream" } else { "big" },
            &spec,
            &endpoint,
            &table,
            &record,
        )
        .await;
        // 6 MB minus a little: Lambda's synchronous limit is 6 MB for the event and the response.
        let size = 6 * 1024 * 1024 - 4096;
        let event: Vec<u8> = {
            let mut v = Vec::with_capacity(size);
            v.extend_from_slice(b"{\"data\":\"");
            let mut x: u32 = 7;
            while v.len() < size - 2 {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                v.push(b'a' + ((x >> 16) % 26) as u8);
            }
            v.extend_from_slice(b"\"}");
            v
        };
        let response: Vec<u8> = event.iter().rev().copied().collect();
        std::fs::write(env.dir.join("response.bin"), &response).unwrap();
        let context = "eyJjdXN0b20iOnsiayI6InYifX0="; // {"custom":{"k":"v"}}
        let r = env
            .invoke_with(event.clone(), &[("X-Amz-Client-Context", context)])
            .await;
        assert_eq!(r.status, 200, "{}", env.log());
        assert!(
            r.body.len() == response.len() && r.body == response,
            "response differs ({} vs {} bytes); log:\n{}",
            r.body.len(),
            response.len(),
            env.log()
        );
        let got = std::fs::read(env.dir.join("1.event")).unwrap();
        assert!(
            got == event,
            "event differs ({} vs {} bytes)",
            got.len(),
            event.len()
        );
        let headers: serde_json::Value =
            serde_json::from_slice(&std::fs::read(env.dir.join("1.headers.json")).unwrap())
                .unwrap();
        // Every header RIE sends, with its name exactly as RIE writes it (Go's canonical case).
        let cc = headers["Lambda-Runtime-Client-Context"]
            .as_str()
            .unwrap_or_default();
        assert!(
            cc == context || cc.contains("custom"),
            "client context lost: {headers}"
        );
        for h in [
            "Lambda-Runtime-Aws-Request-Id",
            "Lambda-Runtime-Deadline-Ms",
            "Lambda-Runtime-Invoked-Function-Arn",
            "Content-Type",
        ] {
            assert!(
                headers.get(h).is_some(),
                "header {h} lost or renamed: {headers}"
            );
        }
        assert!(env.log().contains("lock released"), "{}", env.log());
        if stream {
            // RIE (at debug level) logs the headers of the runtime's POST as it received them
            // from the proxy: the streaming mode reached it, with the body chunked through.
            assert!(
                env.log()
                    .contains("Lambda-Runtime-Function-Response-Mode:[streaming]"),
                "the streaming response mode did not reach RIE:\n{}",
                env.log()
            );
        }
        env.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_wrapper_invocations_run_unenforced_and_are_reported() {
    let (endpoint, table) = table("e2e_unenforced").await;
    let record = record_file("unenforced");
    // The init check is switched off (as for chained wrappers), so the per-invocation check is
    // what catches it.
    let spec = Spec {
        wrapper: false,
        ..Spec::layered("nowrapper", Runtime::Python).with("FLIGHTLOCK_WRAPPER_CHECK", "off")
    };
    let env = Env::start("nowrap", &spec, &endpoint, &table, &record).await;
    for seq in 0..2 {
        let r = env.invoke(json!({"seq": seq})).await;
        assert_eq!(r.json()["ok"], true, "{}", env.log());
    }
    assert!(
        env.wait_log("\"UnenforcedInvocations\":1", Duration::from_secs(5))
            .await,
        "{}",
        env.log()
    );
    // Each INVOKE is checked by its own task, which may log just after the invocation returned.
    let until = Instant::now() + Duration::from_secs(5);
    while env.log().matches("UNENFORCED: this invocation").count() < 2 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = env.log();
    assert_eq!(
        log.matches("UNENFORCED: this invocation").count(),
        2,
        "{log}"
    );
    assert!(!log.contains("lock acquired"), "{log}");
    // Judged at once (no runtime ever connected to the proxy), not after a 2 s grace that would
    // keep every finished invocation open.
    assert_eq!(
        log.matches("no runtime has ever connected to the flightlock proxy")
            .count(),
        2,
        "{log}"
    );
    finish(env, &record).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_runtime_without_the_wrapper_fails_init_saying_what_to_set() {
    let (endpoint, table) = table("e2e_nowrapinit").await;
    let record = record_file("nowrapinit");
    let spec = Spec {
        wrapper: false,
        ..Spec::layered("nowrapinit", Runtime::Python)
    };
    let env = Env::start("nowrapinit", &spec, &endpoint, &table, &record).await;
    let r = env.invoke(json!({"seq": 0})).await;
    let body = String::from_utf8_lossy(&r.body).into_owned();
    assert!(
        body.contains("errorType") || r.status >= 400,
        "init should fail: {body}"
    );
    assert!(
        env.wait_log("AWS_LAMBDA_EXEC_WRAPPER is not set", Duration::from_secs(3))
            .await,
        "{}",
        env.log()
    );
    assert!(
        env.log()
            .contains("set AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper"),
        "{}",
        env.log()
    );
    assert!(runs(&record).is_empty(), "the handler must not run");
    finish(env, &record).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_flightlock_value_fails_init_naming_the_variable() {
    let (endpoint, table) = table("e2e_badcfg").await;
    let record = record_file("badcfg");
    let spec = Spec::layered("badcfg", Runtime::Python).with("FLIGHTLOCK_WAIT", "soon");
    let env = Env::start("badcfg", &spec, &endpoint, &table, &record).await;
    let r = env.invoke(json!({"seq": 0})).await;
    let body = String::from_utf8_lossy(&r.body).into_owned();
    assert!(
        body.contains("errorType") || r.status >= 400,
        "init should fail: {body}"
    );
    assert!(
        env.wait_log(
            "FLIGHTLOCK_WAIT=\"soon\" is invalid",
            Duration::from_secs(3)
        )
        .await,
        "{}",
        env.log()
    );
    assert!(env.log().contains("accepted: 0, forever"), "{}", env.log());
    assert!(runs(&record).is_empty(), "the handler must not run");
    finish(env, &record).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_policy_and_key_template_from_the_event() {
    let (endpoint, table) = table("e2e_policy").await;
    let record = record_file("policy");
    let specs: Vec<Spec> = (0..2)
        .map(|_| {
            Spec::layered("perkey", Runtime::Python)
                .with("FLIGHTLOCK_ON_BUSY", "error")
                .with("FLIGHTLOCK_KEY", "job-{/detail/accountId}")
        })
        .collect();
    let envs = start_all("pol", &specs, &endpoint, &table, &record).await;

    // Same account at once: one runs, the other fails with the documented error type.
    let calls = envs.iter().map(|e| async move {
        e.invoke(json!({"detail": {"accountId": "42"}, "sleepMs": 2000}))
            .await
            .json()
    });
    let responses = futures::future::join_all(calls).await;
    assert_eq!(
        responses.iter().filter(|r| r["ok"] == true).count(),
        1,
        "{responses:#?}"
    );
    let busy: Vec<_> = responses
        .iter()
        .filter(|r| r["errorType"] == "FlightlockBusy")
        .collect();
    assert_eq!(busy.len(), 1, "{responses:#?}");
    assert!(
        busy[0]["errorMessage"].as_str().unwrap().contains("job-42"),
        "{busy:?}"
    );

    // Different accounts are different keys: both run, concurrently.
    let calls = envs.iter().enumerate().map(|(i, e)| async move {
        e.invoke(json!({"detail": {"accountId": format!("acct-{i}")}, "sleepMs": 1000}))
            .await
            .json()
    });
    for r in futures::future::join_all(calls).await {
        assert_eq!(r["ok"], true, "{r}");
    }

    // A missing field is a clear invocation error, and the handler does not run.
    let before = runs(&record).len();
    let r = envs[0].invoke(json!({"detail": {}})).await.json();
    assert_eq!(r["errorType"], "FlightlockKeyError", "{r}");
    assert!(
        r["errorMessage"]
            .as_str()
            .unwrap()
            .contains("/detail/accountId"),
        "{r}"
    );
    assert_eq!(runs(&record).len(), before);
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}
