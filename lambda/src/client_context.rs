//! What the handler learns about its lock, through the invocation's client context.
//!
//! Every managed runtime surfaces the Runtime API's `Lambda-Runtime-Client-Context` header to
//! the handler (Python `context.client_context.custom`, Node.js `context.clientContext.custom`,
//! Java `context.getClientContext().getCustom()`, Rust `lambda_runtime`'s
//! `event.context.client_context`). The header is plain JSON: Lambda decodes the Invoke API's
//! base64 `ClientContext` before it reaches the runtime, and `awslambdaric`, `aws-lambda-ric` and
//! `lambda_runtime` parse it with `json.loads` / `JSON.parse` / `serde_json` as it comes.
//!
//! Under `custom`, the handler finds string-valued entries (strings, because Java's
//! `getCustom()` is a `Map<String, String>` and `lambda_runtime`'s a `HashMap<String, String>`):
//!
//! | entry | value |
//! |---|---|
//! | [`TICKET`] `flightlockTicket` | the fencing token, decimal |
//! | [`PERMITS`] `flightlockPermits` | the key's permits (how many hold it at a time), only when more than 1: the ticket then identifies this hold, it is not a fence |
//! | [`WAITED_MS`] `flightlockWaitedMs` | time spent acquiring, whole ms |
//! | [`TICK`] `flightlockTick` | the invocation's tick (RFC 3339 or an id), only when it has one |
//! | [`KEY`] `flightlockKey` | the lock key |
//!
//! [`merge`] adds them to the caller's client context (the Invoke API's `ClientContext`)
//! without changing anything else of it: `client`, `env` and the caller's own `custom` entries
//! keep their exact JSON text. Names starting with [`PREFIX`] are flightlock's: a caller's
//! entries of that name are removed, so a handler never reads a token it was sent by a caller.
//!
//! **Size.** The Invoke API takes at most [`INVOKE_CLIENT_CONTEXT_MAX`] bytes of base64
//! `ClientContext`, that is [`MAX_JSON`] bytes of JSON. The merged context stays within that:
//! if the caller's context leaves too little room, entries are left out from the end of the
//! table above (the key first, the ticket last) and the caller learns which from
//! [`Merged::Header::omitted`]. A context that is not a JSON object (or whose `custom` is not
//! an object) is passed on unchanged without entries: the runtime clients fail such an
//! invocation themselves while parsing it.
//!
//! Pure: no I/O.

use std::collections::{BTreeMap, HashMap};

use serde_json::value::RawValue;

/// The Runtime API header carrying the client context.
pub const CLIENT_CONTEXT_HEADER: &str = "Lambda-Runtime-Client-Context";

/// Every entry name of flightlock's starts with this; such names are reserved.
pub const PREFIX: &str = "flightlock";
/// The fencing token (decimal).
pub const TICKET: &str = "flightlockTicket";
/// The lock key.
pub const KEY: &str = "flightlockKey";
/// Time spent acquiring, whole milliseconds (decimal).
pub const WAITED_MS: &str = "flightlockWaitedMs";
/// The invocation's tick, when it has one.
pub const TICK: &str = "flightlockTick";
/// The key's permits (decimal), only when more than 1: the ticket then identifies this hold
/// among up to that many overlapping ones, and is not a fence against them.
pub const PERMITS: &str = "flightlockPermits";

/// The Invoke API's limit on `ClientContext`: bytes of base64.
pub const INVOKE_CLIENT_CONTEXT_MAX: usize = 3583;
/// The largest JSON text whose padded base64 fits [`INVOKE_CLIENT_CONTEXT_MAX`].
pub const MAX_JSON: usize = INVOKE_CLIENT_CONTEXT_MAX / 4 * 3;

/// What one acquired invocation hands to its handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handover {
    /// The fencing token.
    pub ticket: u64,
    /// The lock key.
    pub key: String,
    /// Time spent acquiring, ms.
    pub waited_ms: u64,
    /// The tick, when the invocation has one.
    pub tick: Option<String>,
    /// The key's permits ([`flightlock::LockOptions::permits`]): an entry only when more than 1.
    pub permits: u32,
}

impl Handover {
    /// The entries, most important first (the order in which they are kept when space is short).
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        let mut entries = vec![(TICKET, self.ticket.to_string())];
        if self.permits > 1 {
            entries.push((PERMITS, self.permits.to_string()));
        }
        entries.push((WAITED_MS, self.waited_ms.to_string()));
        if let Some(t) = &self.tick {
            entries.push((TICK, t.clone()));
        }
        entries.push((KEY, self.key.clone()));
        entries
    }

    /// Puts the entries into an already parsed `custom` map (the in-process layer), replacing
    /// any reserved entries a caller sent.
    pub fn apply(&self, custom: &mut HashMap<String, String>) {
        custom.retain(|k, _| !k.starts_with(PREFIX));
        for (name, value) in self.entries() {
            custom.insert(name.to_owned(), value);
        }
    }
}

/// Why a client context was passed on unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unchanged {
    /// It is not a JSON object (or not UTF-8).
    NotAnObject,
    /// Its `custom` is neither an object nor `null`.
    CustomNotAnObject,
    /// It already uses the whole size limit: not one entry fits.
    NoRoom,
}

impl std::fmt::Display for Unchanged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unchanged::NotAnObject => "the client context is not a JSON object",
            Unchanged::CustomNotAnObject => "the client context's `custom` is not a JSON object",
            Unchanged::NoRoom => "the client context leaves no room within the Invoke API's limit",
        })
    }
}

/// The result of [`merge`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Merged {
    /// Send this header value (JSON text).
    Header {
        /// The merged client context.
        value: String,
        /// Entries left out for lack of room, in the order they were dropped.
        omitted: Vec<&'static str>,
        /// Entries with a reserved name the caller sent, removed.
        removed: usize,
    },
    /// Keep the caller's header as it is (or send none if there was none).
    Unchanged(Unchanged),
}

type Object = BTreeMap<String, Box<RawValue>>;

/// Merges `ours` into the caller's client context `caller` (the header's bytes; `None` or empty:
/// there was none). See the module docs.
pub fn merge(caller: Option<&[u8]>, ours: &Handover) -> Merged {
    let mut top: Object = match caller.filter(|b| !b.trim_ascii().is_empty()) {
        None => Object::new(),
        Some(bytes) => match serde_json::from_slice(bytes) {
            Ok(o) => o,
            Err(_) => return Merged::Unchanged(Unchanged::NotAnObject),
        },
    };
    let mut custom: Object = match top.get("custom").map(|raw| raw.get().trim()) {
        None | Some("null") => Object::new(),
        Some(raw) => match serde_json::from_str(raw) {
            Ok(o) => o,
            Err(_) => return Merged::Unchanged(Unchanged::CustomNotAnObject),
        },
    };
    let before = custom.len();
    custom.retain(|k, _| !k.starts_with(PREFIX));
    let removed = before - custom.len();
    let mut entries = ours.entries();
    let mut omitted = Vec::new();
    loop {
        let mut with = custom.clone();
        for (name, value) in &entries {
            let Ok(raw) = RawValue::from_string(ascii_json_string(value)) else {
                return Merged::Unchanged(Unchanged::NotAnObject);
            };
            with.insert((*name).to_owned(), raw);
        }
        let Ok(raw) = RawValue::from_string(object_text(&with)) else {
            return Merged::Unchanged(Unchanged::NotAnObject);
        };
        top.insert("custom".to_owned(), raw);
        let value = object_text(&top);
        if value.len() <= MAX_JSON {
            if entries.is_empty() && removed == 0 {
                return Merged::Unchanged(Unchanged::NoRoom);
            }
            return Merged::Header {
                value,
                omitted,
                removed,
            };
        }
        match entries.pop() {
            Some((name, _)) => omitted.push(name),
            // Not even without ours: the caller's own context is at the limit. Still send it
            // without the reserved entries it carried, so no handler reads a forged token.
            None if removed > 0 => {
                return Merged::Header {
                    value,
                    omitted,
                    removed,
                }
            }
            None => return Merged::Unchanged(Unchanged::NoRoom),
        }
    }
}

/// `{"name":value,...}` with each value's JSON text as it is and names ASCII-escaped.
fn object_text(object: &Object) -> String {
    let mut out = String::from("{");
    for (i, (name, value)) in object.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&ascii_json_string(name));
        out.push(':');
        out.push_str(value.get());
    }
    out.push('}');
    out
}

/// `s` as a JSON string in ASCII only (`\uXXXX` escapes): a header value other than visible
/// ASCII is refused by some clients (`lambda_runtime` reads the header with `to_str`).
fn ascii_json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests;
