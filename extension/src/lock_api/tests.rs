use super::*;

#[test]
fn routes_name_the_invocation_and_refuse_what_is_not_a_call() {
    let id = "8476a536-e9f4-11e8-9739-2dfe598c3fcd";
    let at = |op: &str| format!("/flightlock/v1/invocations/{id}/{op}");
    assert_eq!(
        route(&Method::POST, &at("acquire")),
        Some(Ok(Call::Acquire(id.into())))
    );
    assert_eq!(
        route(&Method::POST, &at("release")),
        Some(Ok(Call::Release(id.into())))
    );
    assert_eq!(
        route(&Method::GET, &at("locks")),
        Some(Ok(Call::List(id.into())))
    );
    let status = |m: &Method, p: &str| route(m, p).unwrap().unwrap_err().status;
    assert_eq!(
        status(&Method::GET, &at("acquire")),
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        status(&Method::DELETE, &at("locks")),
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(status(&Method::POST, &at("steal")), StatusCode::NOT_FOUND);
    assert_eq!(
        status(&Method::POST, "/flightlock/v1/invocations//acquire"),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        status(&Method::GET, "/flightlock/v1/"),
        StatusCode::NOT_FOUND
    );
    // The Runtime API and anything else is not the API's: the proxy passes it on.
    assert_eq!(
        route(&Method::GET, "/2018-06-01/runtime/invocation/next"),
        None
    );
    assert_eq!(route(&Method::GET, "/flightlock/v2/x"), None);
}

#[test]
fn only_the_environments_session_token_is_accepted() {
    let token = "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJH";
    let header = |v: &str| HeaderValue::from_str(v).unwrap();
    assert!(authorize(Some(token), Some(&header(token))).is_ok());
    let status = |expected: Option<&str>, sent: Option<&HeaderValue>| {
        let r = authorize(expected, sent).unwrap_err();
        assert!(
            !r.message.contains(token),
            "the token is never echoed: {}",
            r.message
        );
        (r.status, r.error)
    };
    assert_eq!(
        status(Some(token), None),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
    for wrong in [
        "",
        "x",
        &token[..token.len() - 1],
        &format!("{token}x"),
        &token.replace('I', "J"),
    ] {
        assert_eq!(
            status(Some(token), Some(&header(wrong))),
            (StatusCode::FORBIDDEN, "forbidden"),
            "{wrong:?}"
        );
    }
    // No session token in the extension's environment: nothing is accepted, not even an empty
    // header.
    assert_eq!(
        status(None, Some(&header(""))),
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
    );
}

#[test]
fn bodies_are_read_strictly_with_the_reason_on_each_refusal() {
    assert_eq!(
        parse_acquire(br#"{"key":"order-7"}"#).unwrap(),
        AcquireBody {
            key: "order-7".into(),
            wait_ms: None,
            permits: None
        }
    );
    assert_eq!(
        parse_acquire(br#"{"key":"k","waitMs":250,"permits":3}"#).unwrap(),
        AcquireBody {
            key: "k".into(),
            wait_ms: Some(250),
            permits: Some(3)
        }
    );
    let refused = |body: &str| {
        let r = parse_acquire(body.as_bytes()).unwrap_err();
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {r:?}");
        r.message
    };
    assert!(refused("").contains("for example"));
    assert!(refused("[]").contains("for example"));
    assert!(refused(r#"{"key":"k","wait":5}"#).contains("unknown field `wait`"));
    assert!(refused(r#"{"waitMs":5}"#).contains("missing field `key`"));
    assert!(refused(r#"{"key":7}"#).contains("invalid type"));
    assert!(refused(r#"{"key":"k","waitMs":-1}"#).contains("invalid value"));
    assert!(refused(r#"{"key":""}"#).contains("empty"));
    let long = format!(r#"{{"key":"{}"}}"#, "k".repeat(1025));
    assert!(refused(&long).contains("at most 1024 bytes"));
    assert!(refused(r#"{"key":"k","waitMs":900001}"#).contains("longer than any invocation"));
    assert!(refused(r#"{"key":"k","permits":0}"#).contains("1 to 100"));
    assert!(refused(r#"{"key":"k","permits":101}"#).contains("1 to 100"));
    assert_eq!(parse_release(br#"{"key":"k"}"#).unwrap().key, "k");
    let r = parse_release(br#"{"key":"k","waitMs":1}"#).unwrap_err();
    assert!(r.message.contains("unknown field `waitMs`"), "{r:?}");
}
