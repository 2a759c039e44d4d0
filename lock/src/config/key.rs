//! Lock keys rendered from the event: `job-{/detail/accountId}`.

use std::fmt;

use super::seek::{self, Found};
use crate::schema::validate_key;

/// One piece of a [`KeyTemplate`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Pointer(String),
}

/// A lock key with `{/json/pointer}` placeholders filled from the event, e.g.
/// `job-{/detail/accountId}`. `{{` and `}}` stand for literal braces.
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
    /// A placeholder points at an object or array.
    #[error("the key template {template:?}: event field {pointer} is an object or array; point at a string, number or boolean")]
    NotScalar {
        /// The template.
        template: String,
        /// The JSON pointer.
        pointer: String,
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
                    if !pointer.starts_with('/') {
                        return Err(format!(
                            "placeholder `{{{pointer}}}` is not a JSON pointer (it must start with /)"
                        ));
                    }
                    if !text.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut text)));
                    }
                    parts.push(Part::Pointer(pointer));
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
        self.parts.iter().any(|p| matches!(p, Part::Pointer(_)))
    }

    /// The template as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the key from the raw event bytes, with memory bounded by the template, not the
    /// event: each placeholder's field is found by a streaming walk that skips everything else
    /// (see `config/seek.rs`); no `serde_json::Value` of the event is built. The event is
    /// parsed only if the template reads it. Same results as [`KeyTemplate::render`].
    pub fn render_bytes(&self, event: &[u8]) -> Result<String, KeyError> {
        if !self.reads_event() {
            return self.render(&serde_json::Value::Null);
        }
        let mut key = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => key.push_str(t),
                Part::Pointer(p) => {
                    let found =
                        seek::find(event, &seek::tokens(p)).map_err(|e| KeyError::NotJson {
                            template: self.source.clone(),
                            problem: e.to_string(),
                        })?;
                    match found {
                        Found::Str(s) | Found::Scalar(s) => key.push_str(&s),
                        Found::Missing => {
                            return Err(KeyError::Missing {
                                template: self.source.clone(),
                                pointer: p.clone(),
                            })
                        }
                        Found::Composite => {
                            return Err(KeyError::NotScalar {
                                template: self.source.clone(),
                                pointer: p.clone(),
                            })
                        }
                    }
                }
            }
        }
        validate_key(&key).map_err(|e| KeyError::InvalidKey {
            template: self.source.clone(),
            problem: e.to_string(),
        })?;
        Ok(key)
    }

    /// Renders the key from a parsed event.
    pub fn render(&self, event: &serde_json::Value) -> Result<String, KeyError> {
        let mut key = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => key.push_str(t),
                Part::Pointer(p) => match event.pointer(p) {
                    None | Some(serde_json::Value::Null) => {
                        return Err(KeyError::Missing {
                            template: self.source.clone(),
                            pointer: p.clone(),
                        })
                    }
                    Some(serde_json::Value::String(s)) => key.push_str(s),
                    Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                        key.push_str(&v.to_string())
                    }
                    Some(_) => {
                        return Err(KeyError::NotScalar {
                            template: self.source.clone(),
                            pointer: p.clone(),
                        })
                    }
                },
            }
        }
        validate_key(&key).map_err(|e| KeyError::InvalidKey {
            template: self.source.clone(),
            problem: e.to_string(),
        })?;
        Ok(key)
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
