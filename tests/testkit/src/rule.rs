//! Fault rules for [`FaultProxy`](crate::FaultProxy): what to match and what to do.

use std::time::Duration;

/// What the proxy does to a request that a [`Rule`] fires on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Hold the request for this long, then forward it normally.
    DelayRequest(Duration),
    /// Forward the request at once (so the write happens upstream), then hold
    /// the response for this long before returning it to the client.
    DelayResponse(Duration),
    /// Forward the request (so the write happens upstream), wait for the
    /// response, then close the client connection without answering. The
    /// client sees an I/O error ("connection closed before message
    /// completed") and, for the AWS SDK, retries.
    DropResponse,
    /// Forward the request twice: the second copy is sent after the first
    /// one's response has been received in full. The client gets the first
    /// response; the second one is discarded.
    Duplicate,
    /// Do not forward; answer HTTP 400 with DynamoDB's
    /// `ProvisionedThroughputExceededException` JSON body, which the SDK
    /// classifies as a throttling error.
    Throttle,
    /// Do not forward; answer HTTP 500 with DynamoDB's `InternalServerError`
    /// JSON body, which the SDK classifies as a transient server error.
    ServerError,
}

/// A fault-injection rule: which requests it matches and what [`Fault`] it
/// injects.
///
/// Rules are tried in insertion order. A request that matches a rule's
/// [`operation`](Rule::operation) and [`body_contains`](Rule::body_contains)
/// first consumes the rule's [`skip`](Rule::skip) count (the request passes
/// through untouched by this rule), then the fault fires up to
/// [`times`](Rule::times) times (`None` = forever). The first rule that fires
/// wins; a rule that is skipping or exhausted lets later rules be tried.
///
/// ```
/// use flightlock_testkit::{Fault, Rule};
/// // Throttle the second and third TransactWriteItems that mention "queue#a".
/// let rule = Rule::new(Fault::Throttle)
///     .on("TransactWriteItems")
///     .body_contains("queue#a")
///     .skip(1)
///     .times(2);
/// assert_eq!(rule.operation.as_deref(), Some("TransactWriteItems"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// DynamoDB operation name to match, e.g. `"TransactWriteItems"` (the part
    /// of the `X-Amz-Target` header after the last `.`); `None` matches any
    /// request.
    pub operation: Option<String>,
    /// Substring the raw request body must contain; `None` matches any body.
    pub body_contains: Option<String>,
    /// Number of matching requests to let through before the fault fires.
    pub skip: u32,
    /// Maximum number of times the fault fires; `None` means forever.
    pub times: Option<u32>,
    /// The fault to inject.
    pub fault: Fault,
}

impl Rule {
    /// A rule that injects `fault` into every request, forever.
    pub fn new(fault: Fault) -> Rule {
        Rule {
            operation: None,
            body_contains: None,
            skip: 0,
            times: None,
            fault,
        }
    }

    /// Only match requests for this DynamoDB operation (e.g. `"PutItem"`).
    pub fn on(mut self, op: &str) -> Rule {
        self.operation = Some(op.to_owned());
        self
    }

    /// Only match requests whose raw body contains `s`.
    pub fn body_contains(mut self, s: &str) -> Rule {
        self.body_contains = Some(s.to_owned());
        self
    }

    /// Let the first `n` matching requests through before firing.
    pub fn skip(mut self, n: u32) -> Rule {
        self.skip = n;
        self
    }

    /// Fire at most `n` times.
    pub fn times(mut self, n: u32) -> Rule {
        self.times = Some(n);
        self
    }

    fn matches(&self, operation: Option<&str>, body: &[u8]) -> bool {
        if let Some(want) = &self.operation {
            if operation != Some(want.as_str()) {
                return false;
            }
        }
        match &self.body_contains {
            Some(needle) => contains(body, needle.as_bytes()),
            None => true,
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// A rule together with its progress.
#[derive(Debug)]
struct RuleState {
    rule: Rule,
    skipped: u32,
    fired: u32,
}

/// The ordered rule list of a proxy.
#[derive(Debug, Default)]
pub(crate) struct RuleSet {
    rules: Vec<RuleState>,
}

impl RuleSet {
    pub(crate) fn push(&mut self, rule: Rule) {
        self.rules.push(RuleState {
            rule,
            skipped: 0,
            fired: 0,
        });
    }

    pub(crate) fn clear(&mut self) {
        self.rules.clear();
    }

    /// Finds the fault to apply to a request, updating skip and fire counts.
    pub(crate) fn select(&mut self, operation: Option<&str>, body: &[u8]) -> Option<Fault> {
        for state in &mut self.rules {
            if !state.rule.matches(operation, body) {
                continue;
            }
            if state.skipped < state.rule.skip {
                state.skipped += 1;
                continue;
            }
            if state.rule.times.is_some_and(|max| state.fired >= max) {
                continue;
            }
            state.fired += 1;
            return Some(state.rule.fault.clone());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_then_times() {
        let mut set = RuleSet::default();
        set.push(Rule::new(Fault::Throttle).on("PutItem").skip(1).times(2));
        let picks: Vec<_> = (0..5).map(|_| set.select(Some("PutItem"), b"")).collect();
        assert_eq!(
            picks,
            vec![
                None,
                Some(Fault::Throttle),
                Some(Fault::Throttle),
                None,
                None
            ]
        );
        // Other operations never match and do not consume anything.
        assert_eq!(set.select(Some("GetItem"), b""), None);
        assert_eq!(set.select(None, b""), None);
    }

    #[test]
    fn first_firing_rule_wins_and_exhausted_rules_fall_through() {
        let mut set = RuleSet::default();
        set.push(Rule::new(Fault::Throttle).times(1));
        set.push(Rule::new(Fault::ServerError).body_contains("x"));
        assert_eq!(set.select(Some("A"), b"x"), Some(Fault::Throttle));
        assert_eq!(set.select(Some("A"), b"x"), Some(Fault::ServerError));
        assert_eq!(set.select(Some("A"), b"y"), None);
        set.clear();
        assert_eq!(set.select(Some("A"), b"x"), None);
    }

    #[test]
    fn skipping_rule_lets_later_rules_fire() {
        let mut set = RuleSet::default();
        set.push(Rule::new(Fault::Throttle).skip(1));
        set.push(Rule::new(Fault::ServerError).times(1));
        assert_eq!(set.select(None, b""), Some(Fault::ServerError));
        assert_eq!(set.select(None, b""), Some(Fault::Throttle));
    }

    #[test]
    fn body_substring() {
        assert!(contains(b"abcdef", b"cde"));
        assert!(!contains(b"abc", b"abcd"));
        assert!(contains(b"abc", b""));
        let rule = Rule::new(Fault::Duplicate).body_contains("\"lock#1\"");
        assert!(rule.matches(None, br#"{"pk":"lock#1"}"#));
        assert!(!rule.matches(None, br#"{"pk":"lock#10"}"#));
    }
}
