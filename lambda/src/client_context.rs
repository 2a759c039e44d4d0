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
//! **A caller cannot forge them.** Names starting with [`PREFIX`] are flightlock's. The caller's
//! context (the Invoke API's `ClientContext`) is first [`read`] strictly, and the handler only
//! ever gets the context [`CallerContext::merge`] writes anew from what was read — never the
//! caller's bytes — with the caller's reserved entries removed and ours added. Strictly means:
//! one header, UTF-8, one JSON object (`serde_json`, which refuses lone surrogates, control
//! characters, numbers beyond f64 and nesting deeper than 128), no name twice at the top level or in `custom`, and a
//! `custom` that is an object, `null` or absent. Whatever fails that is [`Unreadable`]: parsers
//! differ exactly there (Node.js and Python accept a lone surrogate `serde_json` refuses; one
//! parser keeps the first of two equal names, another the last), so the extension could not know
//! what the caller meant or the handler would read, and it fails the invocation before taking the
//! lock, with `errorType` [`crate::responses::CONTEXT_ERROR_TYPE`], rather than drop the
//! caller's context unannounced or hand it on unchecked. (Writing anew is what keeps forged
//! entries out: a name given twice is refused so that no caller's entry is lost unannounced.) Contexts the Invoke API's callers actually send
//! (the AWS SDKs' `ClientContext`, a JSON object of `client`, `custom` and `env`) are never
//! refused.
//!
//! The merge keeps everything else of the caller's context: `client`, `env` and the caller's own
//! `custom` entries keep their exact JSON text; names are written again with ASCII escapes.
//!
//! **Size.** The Invoke API takes at most [`INVOKE_CLIENT_CONTEXT_MAX`] bytes of base64
//! `ClientContext`, that is [`MAX_JSON`] bytes of JSON. The merged context stays within that
//! where it can: if the caller's context leaves too little room, entries are left out from the
//! end of the table above (the key first, the ticket last) and the caller learns which from
//! [`Merged::omitted`]. A caller's context that fills the limit itself is still written anew,
//! without its reserved entries and without ours.
//!
//! The in-process layer gets the context already parsed by `lambda_runtime` (with `serde_json`,
//! last of two equal names kept; a header it cannot parse fails the invocation before the layer
//! runs), and the handler gets that same parsed map: [`LockContext::apply`] removes the reserved
//! entries from it and adds ours.
//!
//! Pure: no I/O.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
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

/// What the handler of one acquired invocation is told about its lock: the entries written into
/// its client context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockContext {
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

impl LockContext {
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

    /// Puts the entries into an already parsed `custom` map (the in-process layer), removing
    /// every reserved entry a caller sent, also those of names this invocation does not write.
    pub fn apply(&self, custom: &mut HashMap<String, String>) {
        custom.retain(|k, _| !is_reserved(k));
        for (name, value) in self.entries() {
            custom.insert(name.to_owned(), value);
        }
    }
}

/// Why a caller's client context cannot be read with certainty (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// The header came more than once.
    Repeated,
    /// It is not one JSON object in UTF-8 (the parser's words).
    NotAnObject(String),
    /// A name appears twice at the top level or in `custom`.
    DuplicateName(String),
    /// Its `custom` is neither an object nor `null`.
    CustomNotAnObject,
    /// A top-level name other than `custom` that a case-insensitive reader takes for `custom`
    /// (Go's `encoding/json` folds `Custom` and `cuſtom` into the `Custom` field; see
    /// [`reads_as`]).
    LookalikeName(String),
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unreadable::Repeated => f.write_str("the client context header came more than once"),
            Unreadable::NotAnObject(why) => {
                write!(
                    f,
                    "the client context is not one JSON object in UTF-8 ({why})"
                )
            }
            Unreadable::DuplicateName(name) => write!(
                f,
                "the client context names {} twice, which JSON parsers read differently",
                ascii_json_string(name)
            ),
            Unreadable::CustomNotAnObject => {
                f.write_str("the client context's `custom` is not a JSON object")
            }
            Unreadable::LookalikeName(name) => write!(
                f,
                "the client context has a member {} that case-insensitive readers (Go's \
                 encoding/json, .NET with case-insensitive names) take for `custom`; send \
                 `custom` only",
                ascii_json_string(name)
            ),
        }
    }
}

impl std::error::Error for Unreadable {}

/// A JSON object's members, each value's text as it came, refusing a name given twice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Object(BTreeMap<String, Box<str>>);

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = Object;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Object, A::Error> {
                let mut members = BTreeMap::new();
                while let Some((name, value)) = map.next_entry::<String, Box<RawValue>>()? {
                    if members.contains_key(&name) {
                        return Err(serde::de::Error::custom(Duplicate(name)));
                    }
                    members.insert(name, Box::<str>::from(value));
                }
                Ok(Object(members))
            }
        }
        deserializer.deserialize_map(Members)
    }
}

/// The marker a duplicate name's parse error carries (recognised in [`parse_object`]).
struct Duplicate(String);

impl fmt::Display for Duplicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{DUPLICATE_MARK}{}", self.0)
    }
}

const DUPLICATE_MARK: &str = "flightlock: duplicate name: ";

fn parse_object(text: &str) -> Result<Object, Unreadable> {
    serde_json::from_str(text).map_err(|e| {
        let message = e.to_string();
        match message
            .strip_prefix(DUPLICATE_MARK)
            .and_then(|rest| rest.rsplit_once(" at line "))
        {
            Some((name, _)) => Unreadable::DuplicateName(name.to_owned()),
            None => Unreadable::NotAnObject(message),
        }
    })
}

/// A caller's client context, read with certainty: what [`CallerContext::merge`] hands on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallerContext {
    /// The top-level members other than `custom`.
    top: Object,
    /// `custom`'s members other than reserved ones.
    custom: Object,
    /// How many reserved entries the caller's `custom` carried.
    removed: usize,
}

/// Reads the caller's client context: `headers` are the values of every
/// [`CLIENT_CONTEXT_HEADER`] the event came with (none, or an empty one: there was none).
pub fn read<'a>(headers: impl IntoIterator<Item = &'a [u8]>) -> Result<CallerContext, Unreadable> {
    let mut headers = headers.into_iter();
    let first = headers.next();
    if headers.next().is_some() {
        return Err(Unreadable::Repeated);
    }
    let Some(bytes) = first.filter(|b| !b.trim_ascii().is_empty()) else {
        return Ok(CallerContext::default());
    };
    let text = std::str::from_utf8(bytes).map_err(|e| Unreadable::NotAnObject(e.to_string()))?;
    // The whole text as `serde_json` reads a value: every string's escapes decoded (no lone
    // surrogates), every number within f64, at most 128 levels deep. The members are then read
    // again with their text kept, and no name twice.
    serde_json::from_str::<serde_json::Value>(text)
        .map_err(|e| Unreadable::NotAnObject(e.to_string()))?;
    let mut top = parse_object(text)?;
    if let Some(name) = top
        .0
        .keys()
        .find(|n| *n != "custom" && reads_as(n, "custom"))
    {
        return Err(Unreadable::LookalikeName(name.clone()));
    }
    let mut custom = match top.0.remove("custom") {
        None => Object::default(),
        Some(raw) if &*raw == "null" => Object::default(),
        Some(raw) if !raw.starts_with('{') => return Err(Unreadable::CustomNotAnObject),
        Some(raw) => parse_object(&raw)?,
    };
    let before = custom.0.len();
    custom.0.retain(|name, _| !is_reserved(name));
    let removed = before - custom.0.len();
    Ok(CallerContext {
        top,
        custom,
        removed,
    })
}

/// True if `name` is flightlock's: it starts with [`PREFIX`] as any reader compares names,
/// case-insensitively included (see [`reads_as`]). Every reader the guide names looks `custom`'s
/// entries up by exact name, so only `flightlock*` itself could be misread; removing the
/// look-alikes too costs nothing and holds for a reader that folds case.
pub fn is_reserved(name: &str) -> bool {
    let prefix: String = name.chars().take(PREFIX.len()).collect();
    reads_as(&prefix, PREFIX)
}

/// True if a reader that matches names without regard to case could take `name` for `ascii`
/// (an ASCII lower-case name): both have the same number of characters, and each character of
/// `name` is `ascii`'s, or lower-cases to it, or upper-cases to its upper case.
///
/// That is a superset of every folding the runtimes' JSON readers apply: Go's `encoding/json`
/// (aws-lambda-go) matches a struct field by Unicode simple folding, whose only non-ASCII members
/// of an ASCII letter's orbit are `ſ` (U+017F, upper case `S`) and the Kelvin sign `K` (U+212A,
/// lower case `k`); .NET's ordinal ignore-case compares upper cases (`ı` U+0131 upper-cases to
/// `I`); Java's `equalsIgnoreCase` compares upper and lower cases. Pure.
pub fn reads_as(name: &str, ascii: &str) -> bool {
    name.chars().count() == ascii.len()
        && name.chars().zip(ascii.chars()).all(|(c, a)| {
            c == a
                || c.to_lowercase().eq(std::iter::once(a))
                || c.to_uppercase().eq(a.to_uppercase())
        })
}

/// The result of [`CallerContext::merge`]: the header value the handler gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// The merged client context (JSON text, ASCII but for the caller's own values).
    pub value: String,
    /// Entries left out for lack of room, in the order they were dropped.
    pub omitted: Vec<&'static str>,
    /// Entries with a reserved name the caller sent, removed.
    pub removed: usize,
}

impl CallerContext {
    /// How many reserved entries the caller sent (they are never handed on).
    pub fn removed(&self) -> usize {
        self.removed
    }

    /// The caller's context with `ours` added (none for an invocation that is not gated: the
    /// caller's reserved entries are removed all the same), written anew (see the module docs).
    pub fn merge(&self, ours: Option<&LockContext>) -> Merged {
        let mut entries: Vec<(&'static str, String)> = ours
            .map(LockContext::entries)
            .unwrap_or_default()
            .into_iter()
            .map(|(name, value)| (name, ascii_json_string(&value)))
            .collect();
        let mut omitted = Vec::new();
        loop {
            let value = self.text(&entries);
            if value.len() <= MAX_JSON || entries.is_empty() {
                return Merged {
                    value,
                    omitted,
                    removed: self.removed,
                };
            }
            if let Some((name, _)) = entries.pop() {
                omitted.push(name);
            }
        }
    }

    /// `{...,"custom":{...caller's, ...ours},...}` with the members in name order.
    fn text(&self, ours: &[(&'static str, String)]) -> String {
        let mut custom: BTreeMap<&str, &str> = self
            .custom
            .0
            .iter()
            .map(|(name, raw)| (name.as_str(), &**raw))
            .collect();
        for (name, value) in ours {
            custom.insert(name, value);
        }
        let custom = object_text(custom);
        let mut top: BTreeMap<&str, &str> = self
            .top
            .0
            .iter()
            .map(|(name, raw)| (name.as_str(), &**raw))
            .collect();
        top.insert("custom", &custom);
        object_text(top)
    }
}

/// `{"name":value,...}` with each value's JSON text as it is and names ASCII-escaped.
fn object_text(members: BTreeMap<&str, &str>) -> String {
    let mut out = String::from("{");
    for (i, (name, value)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&ascii_json_string(name));
        out.push(':');
        out.push_str(value);
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
