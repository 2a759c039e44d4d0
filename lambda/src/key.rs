//! Lock keys rendered from the invocation (`FLIGHTLOCK_KEY`): `job-{/detail/accountId}` reads
//! the event, `job-{tenant}` the tenant of a function in tenant isolation mode, and
//! `order-{/Records/0/body|json/orderId}` a field of JSON text held in a string of the event (an
//! SQS message's body, a `detail` sent as a string). Pure; the event's fields are found by a
//! streaming walk (`key/seek.rs`), so no tree of the event is built.

use std::fmt;

mod seek;

use flightlock::schema::validate_key;
use seek::Found;

/// One piece of a [`KeyTemplate`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    /// `{/a|json/b}`: JSON pointers, each after the first read in the JSON text of the string
    /// the one before found. Kept with the placeholder as written, for errors.
    Pointer(Vec<String>, String),
    /// `{tenant}`: the invocation's tenant id.
    Tenant,
}

/// Written after a JSON pointer in a placeholder (`{/Records/0/body|json/orderId}`): the field
/// is a string holding JSON text, and the pointer after it reads that text. It can be chained
/// (`{/a|json/b|json/c}`). A field name containing `|json` cannot be read.
pub const JSON_TEXT: &str = "|json";

/// The placeholder for the invocation's tenant id. Lambda hands it to the runtime in the
/// `Lambda-Runtime-Aws-Tenant-Id` header of each event when the function's
/// `TenantIsolationMode` is `PER_TENANT` (AWS Lambda developer guide, "Tenant isolation";
/// `lambda_runtime`'s `Context::tenant_id` reads the same header).
pub const TENANT_PLACEHOLDER: &str = "{tenant}";

/// A lock key with `{/json/pointer}` placeholders filled from the event, e.g.
/// `job-{/detail/accountId}`, and `{tenant}` filled with the invocation's tenant id (tenant
/// isolation mode). `{{` and `}}` stand for literal braces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate {
    source: String,
    parts: Vec<Part>,
}

/// Why a key could not be rendered from an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The event is not JSON, but the template reads it.
    #[error("the key template {template:?} reads the event, but the event is not JSON: {problem}")]
    NotJson {
        /// The template.
        template: String,
        /// The parser's message.
        problem: String,
    },
    /// A placeholder points at nothing, or at null.
    #[error(
        "the key template {template:?} needs the event field {pointer}, which is missing or null"
    )]
    Missing {
        /// The template.
        template: String,
        /// The JSON pointer.
        pointer: String,
    },
    /// A placeholder reads JSON text (`|json`) from a field that is not a string of JSON.
    #[error("the key template {template:?} reads {pointer} as JSON text, but {problem}")]
    NotJsonText {
        /// The template.
        template: String,
        /// The pointer to the field.
        pointer: String,
        /// What the field is instead.
        problem: String,
    },
    /// A placeholder points at an object or array.
    #[error("the key template {template:?}: event field {pointer} is an object or array; point at a string, number or boolean")]
    NotScalar {
        /// The template.
        template: String,
        /// The JSON pointer.
        pointer: String,
    },
    /// The template uses `{tenant}`, but the invocation came without a tenant id (the function
    /// is not in tenant isolation mode, or the runtime path does not pass it).
    #[error(
        "the key template {template:?} uses {{tenant}}, but the invocation has no tenant id \
         (only functions with TenantIsolationMode=PER_TENANT get one)"
    )]
    NoTenant {
        /// The template.
        template: String,
    },
    /// The rendered key is empty or too long.
    #[error("the key template {template:?} rendered an invalid key: {problem}")]
    InvalidKey {
        /// The template.
        template: String,
        /// What is wrong.
        problem: String,
    },
}

impl KeyTemplate {
    /// A template that is `key`, literally (no placeholders, braces kept).
    pub fn literal(key: &str) -> KeyTemplate {
        KeyTemplate {
            source: key.to_owned(),
            parts: vec![Part::Text(key.to_owned())],
        }
    }

    /// Parses a template.
    pub fn parse(src: &str) -> Result<KeyTemplate, String> {
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut chars = src.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    text.push('}');
                }
                '}' => return Err("unmatched `}` (write `}}` for a literal brace)".into()),
                '{' => {
                    let mut pointer = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some('{') => return Err("`{` inside a placeholder".into()),
                            Some(c) => pointer.push(c),
                            None => return Err(format!("unclosed placeholder `{{{pointer}`")),
                        }
                    }
                    let part = if pointer == "tenant" {
                        Part::Tenant
                    } else if pointer.starts_with('/') {
                        let chain: Vec<String> =
                            pointer.split(JSON_TEXT).map(str::to_owned).collect();
                        if let Some(bad) = chain[1..].iter().find(|p| !p.starts_with('/')) {
                            return Err(format!(
                                "placeholder `{{{pointer}}}`: `{JSON_TEXT}` must be followed by a \
                                 JSON pointer (starting with /), not {bad:?}"
                            ));
                        }
                        Part::Pointer(chain, pointer)
                    } else {
                        return Err(format!(
                            "placeholder `{{{pointer}}}` is neither {TENANT_PLACEHOLDER} nor a JSON \
                             pointer (which starts with /)"
                        ));
                    };
                    if !text.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut text)));
                    }
                    parts.push(part);
                }
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            parts.push(Part::Text(text));
        }
        if parts.is_empty() {
            return Err("the key is empty".into());
        }
        Ok(KeyTemplate {
            source: src.to_owned(),
            parts,
        })
    }

    /// True if the template reads the event.
    pub fn reads_event(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Pointer(..)))
    }

    /// True if the template uses the tenant id.
    pub fn reads_tenant(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Tenant))
    }

    /// The template as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the key from the raw event bytes, with memory bounded by the template, not the
    /// event: each placeholder's field is found by a streaming walk that skips everything else
    /// (see `key/seek.rs`); no `serde_json::Value` of the event is built. The event is
    /// parsed only if the template reads it. Same results as [`KeyTemplate::render`].
    pub fn render_bytes(&self, event: &[u8]) -> Result<String, KeyError> {
        self.render_invocation(event, None)
    }

    /// Renders the key from the raw event bytes and the invocation's tenant id (`None`: the
    /// invocation has none; a template with `{tenant}` then fails with [`KeyError::NoTenant`]).
    pub fn render_invocation(
        &self,
        event: &[u8],
        tenant: Option<&str>,
    ) -> Result<String, KeyError> {
        if !self.reads_event() {
            return self.render_with(&serde_json::Value::Null, tenant);
        }
        let mut key = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => key.push_str(t),
                Part::Tenant => key.push_str(self.tenant(tenant)?),
                Part::Pointer(chain, written) => {
                    key.push_str(&self.seek(event, chain, written)?);
                }
            }
        }
        validate_key(&key).map_err(|e| KeyError::InvalidKey {
            template: self.source.clone(),
            problem: e.to_string(),
        })?;
        Ok(key)
    }

    /// Renders the key from a parsed event (no tenant id).
    pub fn render(&self, event: &serde_json::Value) -> Result<String, KeyError> {
        self.render_with(event, None)
    }

    /// The tenant id, or the error saying the template needs one. An empty header counts as
    /// none: an empty tenant would make every tenant's key the same.
    fn tenant<'t>(&self, tenant: Option<&'t str>) -> Result<&'t str, KeyError> {
        tenant
            .filter(|t| !t.is_empty())
            .ok_or_else(|| KeyError::NoTenant {
                template: self.source.clone(),
            })
    }

    /// Renders the key from a parsed event and the invocation's tenant id.
    pub fn render_with(
        &self,
        event: &serde_json::Value,
        tenant: Option<&str>,
    ) -> Result<String, KeyError> {
        let mut key = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => key.push_str(t),
                Part::Tenant => key.push_str(self.tenant(tenant)?),
                Part::Pointer(chain, written) => {
                    key.push_str(&self.lookup(event, chain, written)?);
                }
            }
        }
        validate_key(&key).map_err(|e| KeyError::InvalidKey {
            template: self.source.clone(),
            problem: e.to_string(),
        })?;
        Ok(key)
    }
}

impl KeyTemplate {
    /// The field `chain` points at in raw `event` bytes, by the streaming walk (`|json` steps
    /// walk the text of the string found before them).
    fn seek(&self, event: &[u8], chain: &[String], written: &str) -> Result<String, KeyError> {
        let mut text: Option<String> = None;
        for (i, pointer) in chain.iter().enumerate() {
            let bytes = text.as_deref().map_or(event, str::as_bytes);
            let found = seek::find(bytes, &seek::tokens(pointer)).map_err(|e| match i {
                0 => KeyError::NotJson {
                    template: self.source.clone(),
                    problem: e.to_string(),
                },
                _ => self.not_json_text(chain, i, format!("it is not JSON ({e})")),
            })?;
            let last = i + 1 == chain.len();
            text = Some(match found {
                Found::Str(s) => s,
                Found::Scalar(s) if last => s,
                Found::Missing => return Err(self.missing(chain, i, written)),
                Found::Composite if last => return Err(self.not_scalar(written)),
                Found::Scalar(_) | Found::Composite => {
                    return Err(self.not_json_text(chain, i + 1, "it is not a string".to_owned()))
                }
            });
        }
        Ok(text.unwrap_or_default())
    }

    /// The field `chain` points at in a parsed `event`; same results as [`KeyTemplate::seek`].
    fn lookup(
        &self,
        event: &serde_json::Value,
        chain: &[String],
        written: &str,
    ) -> Result<String, KeyError> {
        use serde_json::Value;
        let mut parsed: Option<Value> = None;
        for (i, pointer) in chain.iter().enumerate() {
            let doc = parsed.as_ref().unwrap_or(event);
            let last = i + 1 == chain.len();
            let next = match doc.pointer(pointer) {
                None | Some(Value::Null) => return Err(self.missing(chain, i, written)),
                Some(Value::String(s)) if last => return Ok(s.clone()),
                Some(v @ (Value::Number(_) | Value::Bool(_))) if last => return Ok(v.to_string()),
                Some(_) if last => return Err(self.not_scalar(written)),
                Some(Value::String(s)) => serde_json::from_str::<Value>(s).map_err(|e| {
                    self.not_json_text(chain, i + 1, format!("it is not JSON ({e})"))
                })?,
                Some(_) => {
                    return Err(self.not_json_text(chain, i + 1, "it is not a string".to_owned()))
                }
            };
            parsed = Some(next);
        }
        Ok(String::new())
    }

    /// The placeholder's pointers up to the `n`th, as written.
    fn written_to(chain: &[String], n: usize) -> String {
        chain[..n].join(JSON_TEXT)
    }

    fn missing(&self, chain: &[String], i: usize, written: &str) -> KeyError {
        KeyError::Missing {
            template: self.source.clone(),
            pointer: if i + 1 == chain.len() {
                written.to_owned()
            } else {
                Self::written_to(chain, i + 1)
            },
        }
    }

    fn not_scalar(&self, written: &str) -> KeyError {
        KeyError::NotScalar {
            template: self.source.clone(),
            pointer: written.to_owned(),
        }
    }

    /// The field of the first `n` pointers was to hold JSON text, but `problem`.
    fn not_json_text(&self, chain: &[String], n: usize, problem: String) -> KeyError {
        KeyError::NotJsonText {
            template: self.source.clone(),
            pointer: Self::written_to(chain, n),
            problem,
        }
    }
}

impl fmt::Display for KeyTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn templates_render_from_the_event() {
        let t = KeyTemplate::parse("job-{/detail/accountId}-{/n}-{/ok}{{x}}").unwrap();
        let ev = serde_json::json!({"detail": {"accountId": "123"}, "n": 7, "ok": true});
        assert_eq!(t.render(&ev).unwrap(), "job-123-7-true{x}");
        let e = t
            .render(&serde_json::json!({"n": 1, "ok": true}))
            .unwrap_err();
        assert!(
            matches!(e, KeyError::Missing { ref pointer, .. } if pointer == "/detail/accountId")
        );
        assert!(e.to_string().contains("/detail/accountId"));
        let e = t
            .render(&serde_json::json!({"detail": {"accountId": null}, "n": 1, "ok": true}))
            .unwrap_err();
        assert!(matches!(e, KeyError::Missing { .. }));
        let e = t
            .render(&serde_json::json!({"detail": {"accountId": [1]}, "n": 1, "ok": true}))
            .unwrap_err();
        assert!(matches!(e, KeyError::NotScalar { .. }));
        assert!(matches!(
            t.render_bytes(b"not json").unwrap_err(),
            KeyError::NotJson { .. }
        ));
        let empty = KeyTemplate::parse("{/s}").unwrap();
        assert!(matches!(
            empty.render(&serde_json::json!({"s": ""})).unwrap_err(),
            KeyError::InvalidKey { .. }
        ));
        // Literal keys never parse the event and keep their braces.
        assert_eq!(
            KeyTemplate::literal("a{b}")
                .render_bytes(b"<xml/>")
                .unwrap(),
            "a{b}"
        );
    }

    #[test]
    fn json_text_in_a_string_field_is_read_with_json() {
        // An SQS record's body and an EventBridge detail sent as a string.
        let t = KeyTemplate::parse("order-{/Records/0/body|json/orderId}").unwrap();
        let ev = serde_json::json!({"Records": [{"body": r#"{"orderId":"o-7","n":1}"#}]});
        let bytes = serde_json::to_vec(&ev).unwrap();
        assert_eq!(t.render(&ev).unwrap(), "order-o-7");
        assert_eq!(t.render_bytes(&bytes).unwrap(), "order-o-7");
        // Chained, and a number at the end.
        let inner = serde_json::json!({"d": r#"{"n":42}"#}).to_string();
        let ev2 = serde_json::json!({"detail": inner});
        let t2 = KeyTemplate::parse("{/detail|json/d|json/n}").unwrap();
        assert_eq!(t2.render(&ev2).unwrap(), "42");
        assert_eq!(t2.render_bytes(ev2.to_string().as_bytes()).unwrap(), "42");
        // Each way it can fail, the same from bytes and from a parsed event, naming the field.
        let cases = [
            (
                json!({"Records": [{"body": "not json"}]}),
                "NotJsonText",
                "/Records/0/body",
            ),
            (
                json!({"Records": [{"body": 7}]}),
                "NotJsonText",
                "/Records/0/body",
            ),
            (
                json!({"Records": [{"body": {"orderId": "x"}}]}),
                "NotJsonText",
                "/Records/0/body",
            ),
            (json!({"Records": []}), "Missing", "/Records/0/body"),
            (
                json!({"Records": [{"body": "{}"}]}),
                "Missing",
                "/Records/0/body|json/orderId",
            ),
            (
                json!({"Records": [{"body": r#"{"orderId":null}"#}]}),
                "Missing",
                "/Records/0/body|json/orderId",
            ),
            (
                json!({"Records": [{"body": r#"{"orderId":[1]}"#}]}),
                "NotScalar",
                "/Records/0/body|json/orderId",
            ),
        ];
        for (ev, kind, pointer) in cases {
            let from_value = t.render(&ev).unwrap_err();
            let from_bytes = t.render_bytes(ev.to_string().as_bytes()).unwrap_err();
            let (k, p) = match &from_value {
                KeyError::NotJsonText { pointer, .. } => ("NotJsonText", pointer),
                KeyError::Missing { pointer, .. } => ("Missing", pointer),
                KeyError::NotScalar { pointer, .. } => ("NotScalar", pointer),
                other => panic!("{other:?}"),
            };
            assert_eq!((k, p.as_str()), (kind, pointer), "{ev}");
            if kind == "NotJsonText" {
                // The parser's words differ between the two paths; the kind and field do not.
                assert!(
                    matches!(from_bytes, KeyError::NotJsonText { ref pointer, .. } if pointer == p),
                    "{from_bytes:?}"
                );
            } else {
                assert_eq!(from_bytes, from_value, "{ev}");
            }
            assert!(from_value.to_string().contains(pointer), "{from_value}");
        }
        // `|json` must lead to a pointer.
        let e = KeyTemplate::parse("{/body|json}").unwrap_err();
        assert!(e.contains("|json"), "{e}");
        let e = KeyTemplate::parse("{/body|jsonx}").unwrap_err();
        assert!(e.contains("JSON pointer"), "{e}");
    }

    #[test]
    fn the_tenant_placeholder_takes_the_invocations_tenant() {
        let t = KeyTemplate::parse("job-{tenant}-{/detail/accountId}").unwrap();
        assert!(t.reads_tenant() && t.reads_event());
        let ev = br#"{"detail":{"accountId":"42"}}"#;
        assert_eq!(
            t.render_invocation(ev, Some("blue")).unwrap(),
            "job-blue-42"
        );
        let value: serde_json::Value = serde_json::from_slice(ev).unwrap();
        assert_eq!(
            t.render_with(&value, Some("green")).unwrap(),
            "job-green-42"
        );
        // Without the event: the tenant alone, and the event is never parsed.
        let only = KeyTemplate::parse("job-{tenant}").unwrap();
        assert!(!only.reads_event());
        assert_eq!(
            only.render_invocation(b"<not json>", Some("blue")).unwrap(),
            "job-blue"
        );
        // No tenant (or an empty one): a typed error naming the template, never a shared key.
        for missing in [None, Some("")] {
            let e = only.render_invocation(b"{}", missing).unwrap_err();
            assert_eq!(
                e,
                KeyError::NoTenant {
                    template: "job-{tenant}".into()
                }
            );
            assert!(e.to_string().contains("TenantIsolationMode"), "{e}");
            assert!(matches!(
                t.render_with(&value, missing),
                Err(KeyError::NoTenant { .. })
            ));
        }
        assert!(matches!(
            only.render_bytes(b"{}"),
            Err(KeyError::NoTenant { .. })
        ));
        // `{{tenant}}` is literal text; other names are refused at parse time.
        let literal = KeyTemplate::parse("job-{{tenant}}").unwrap();
        assert!(!literal.reads_tenant());
        assert_eq!(literal.render_bytes(b"").unwrap(), "job-{tenant}");
        let e = KeyTemplate::parse("job-{tenantid}").unwrap_err();
        assert!(e.contains("{tenant}"), "{e}");
        // A tenant id too long for a key is refused like any other rendered key.
        assert!(matches!(
            only.render_invocation(b"", Some(&"t".repeat(1100))),
            Err(KeyError::InvalidKey { .. })
        ));
    }

    #[test]
    fn the_streaming_walk_agrees_with_serde_json_value() {
        let docs = [
            r#"{"a":{"b":[10,{"c":"x"},true]},"n":-1.5e3,"u":18446744073709551615,"z":null}"#,
            r#"{"a":1,"a":{"b":[0,1,2]},"s":"\u00e9\"q\"","e":{},"l":[],"k/~":"slash"}"#,
            r#"[{"a":"in array"},"two"]"#,
            r#""just a string""#,
            r#"{"big":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","deep":[[[[["d"]]]]],"f":0.1}"#,
        ];
        let pointers = [
            "/a",
            "/a/b",
            "/a/b/0",
            "/a/b/1/c",
            "/a/b/2",
            "/a/b/3",
            "/a/b/01",
            "/a/b/+1",
            "/n",
            "/u",
            "/z",
            "/s",
            "/e",
            "/l",
            "/k~1~0",
            "/0/a",
            "/1",
            "/2",
            "/big",
            "/deep/0/0/0/0/0",
            "/f",
            "/missing",
            "/a/b/1/c/d",
            "/n/x",
        ];
        for doc in docs {
            let value: serde_json::Value = serde_json::from_str(doc).unwrap();
            for p in pointers {
                let t = KeyTemplate::parse(&format!("k-{{{p}}}")).unwrap();
                assert_eq!(
                    t.render_bytes(doc.as_bytes()),
                    t.render(&value),
                    "pointer {p} in {doc}"
                );
            }
        }
        // Anything that is not JSON, even after the field, is refused as before.
        let t = KeyTemplate::parse("{/a}").unwrap();
        for bad in [
            &b"{\"a\":\"x\"} trailing"[..],
            b"{\"a\":\"x\",}",
            b"{\"a\":\"x\"",
            b"",
        ] {
            assert!(
                matches!(t.render_bytes(bad), Err(KeyError::NotJson { .. })),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
