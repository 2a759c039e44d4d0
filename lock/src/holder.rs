//! [`HolderInfo`]: who holds or waits, as written into a queue row and shown in errors and the
//! status view, and how a process names its host in it. A leaf module: the schema encodes it,
//! errors and options carry it.

/// Who holds or waits, for people reading the queue. Never used for decisions.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HolderInfo {
    /// Function name (in Lambda, `AWS_LAMBDA_FUNCTION_NAME`).
    pub function: Option<String>,
    /// Request id of the invocation.
    pub request_id: Option<String>,
    /// Host name and process id, e.g. `ip-10-0-0-1:4242`.
    pub host: Option<String>,
}

impl HolderInfo {
    /// This process as a holder row names it: `hostname:pid`, the hostname being the kernel's
    /// (`/proc/sys/kernel/hostname`), else `$HOSTNAME`, else `unknown`. The one place any
    /// flightlock program reads it.
    pub fn this_host() -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "unknown".to_owned());
        format!("{host}:{}", std::process::id())
    }
}
