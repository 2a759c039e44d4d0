//! The invocation's trace, from the Runtime API's `Lambda-Runtime-Trace-Id` header (X-Ray
//! format: `Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1`), as
//! a W3C trace id and parent span id. Pure.

use opentelemetry::{SpanId, TraceId};

/// The trace an invocation's spans join: its trace id, the span they are children of, and the
/// trace's sampling decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The X-Ray root as a W3C trace id (the 8 hex digits of its epoch and the 24 of its
    /// identifier, in that order: how X-Ray and OpenTelemetry map one to the other).
    pub trace_id: TraceId,
    /// The `Parent` segment: the span ours are children of.
    pub parent: SpanId,
    /// `Sampled=1`. `Sampled=0`, `Sampled=?` (decision deferred) or no `Sampled` field: false.
    pub sampled: bool,
}

/// Parses an X-Ray trace header. `None` if it has no usable `Root` (version 1, 8 + 24 hex
/// digits) or no usable `Parent` (16 hex digits, not all zero): spans without a parent in the
/// invocation's trace would be orphans, so none are made.
pub fn parse(header: &str) -> Option<TraceParent> {
    let (mut root, mut parent, mut sampled) = (None, None, false);
    for field in header.split(';') {
        let Some((name, value)) = field.trim().split_once('=') else {
            continue;
        };
        match name.trim() {
            "Root" => root = trace_id(value.trim()),
            "Parent" => parent = span_id(value.trim()),
            "Sampled" => sampled = value.trim() == "1",
            _ => {}
        }
    }
    Some(TraceParent {
        trace_id: root?,
        parent: parent?,
        sampled,
    })
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `1-{8 hex}-{24 hex}` → the 32 hex digits as a trace id (not the invalid all-zero one).
fn trace_id(root: &str) -> Option<TraceId> {
    let mut parts = root.split('-');
    let (Some("1"), Some(epoch), Some(unique), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    if !is_hex(epoch, 8) || !is_hex(unique, 24) {
        return None;
    }
    TraceId::from_hex(&format!("{epoch}{unique}"))
        .ok()
        .filter(|t| *t != TraceId::INVALID)
}

fn span_id(parent: &str) -> Option<SpanId> {
    if !is_hex(parent, 16) {
        return None;
    }
    SpanId::from_hex(parent)
        .ok()
        .filter(|s| *s != SpanId::INVALID)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_x_ray_header_becomes_a_w3c_trace_id_and_parent() {
        let p = parse("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1")
            .expect("parsed");
        assert_eq!(p.trace_id.to_string(), "5759e988bd862e3fe1be46a994272793");
        assert_eq!(p.parent.to_string(), "53995c3f42cd8ad8");
        assert!(p.sampled);
        // Field order and spaces do not matter; Lineage and other fields are ignored.
        let q = parse(" Sampled=1 ; Lineage=a87bd80c:1|68fd508a:5; Parent=53995c3f42cd8ad8; Root=1-5759e988-bd862e3fe1be46a994272793")
            .expect("parsed");
        assert_eq!(p, q);
    }

    #[test]
    fn only_sampled_1_is_sampled() {
        let base = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8";
        for (tail, sampled) in [
            (";Sampled=0", false),
            (";Sampled=?", false),
            ("", false),
            (";Sampled=1", true),
        ] {
            let p = parse(&format!("{base}{tail}")).expect("parsed");
            assert_eq!(p.sampled, sampled, "{tail:?}");
        }
    }

    #[test]
    fn headers_without_a_usable_root_or_parent_give_nothing() {
        for bad in [
            "",
            "Root=1-0-0",
            "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1",
            "Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
            "Root=1-5759e98-bd862e3fe1be46a9942727930;Parent=53995c3f42cd8ad8",
            "Root=1-5759e988-bd862e3fe1be46a99427279z;Parent=53995c3f42cd8ad8",
            "Root=1-5759e988-bd862e3fe1be46a994272793-1;Parent=53995c3f42cd8ad8",
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=+3995c3f42cd8ad8",
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=0000000000000000",
            "Root=1-00000000-000000000000000000000000;Parent=53995c3f42cd8ad8",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
