//! The shared setup of the protocol tests: a table of their own and bounded waits
//! (`flightlock_testkit::env`, shared with the CLI's tests).

pub use flightlock_testkit::env::*;
