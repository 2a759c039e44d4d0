//! [`HolderInfo`]: who holds or waits, as written into a queue row and shown in errors and the
//! status view. A leaf module: the schema encodes it, errors and options carry it.

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
