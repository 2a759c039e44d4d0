//! The settings only the extension reads: where the proxy listens (`FLIGHTLOCK_PROXY_PORT`), the
//! Runtime API it forwards to (`FLIGHTLOCK_UPSTREAM`, else `AWS_LAMBDA_RUNTIME_API`), the init
//! check of the wrapper (`FLIGHTLOCK_WRAPPER_CHECK`), and the secret callers of the lock API send
//! (`AWS_SESSION_TOKEN`). The in-process layer has no proxy and no
//! wrapper, so these are parsed here, beside the code that uses them; their names belong to the
//! one `FLIGHTLOCK_*` namespace ([`flightlock_lambda::config::KNOWN`]), so the shared parser
//! accepts them and the configuration reference documents them with the rest.
//!
//! Pure, like the shared configuration: [`Settings::from_map`] takes the environment as a map,
//! and a bad value is a [`ConfigError`] naming the variable and the accepted forms.

use std::collections::HashMap;

use flightlock::options::{parse_switch, SWITCH_FORMS};
use flightlock_lambda::config::{value, ConfigError, PROXY_PORT, UPSTREAM, WRAPPER_CHECK};

/// Lambda's variable with the Runtime API address (`host:port`).
pub const RUNTIME_API: &str = "AWS_LAMBDA_RUNTIME_API";

/// Lambda's variable with the session token of the function's credentials: present in the
/// environment of the extension and of the runtime, and nowhere else. Callers of the lock API
/// send it in [`crate::lock_api::TOKEN_HEADER`], as AWS's Parameters and Secrets extension asks
/// of its callers.
pub const SESSION_TOKEN: &str = "AWS_SESSION_TOKEN";

/// Lambda's variable with the token of the container credentials endpoint, set instead of
/// [`SESSION_TOKEN`] in functions restored from a SnapStart snapshot (their credentials come from
/// `AWS_CONTAINER_CREDENTIALS_FULL_URI`). Like the session token it is in the environment of the
/// extension and of the runtime only: the lock API's secret there.
pub const CONTAINER_TOKEN: &str = "AWS_CONTAINER_AUTHORIZATION_TOKEN";

/// Default proxy port (the wrapper script uses the same default).
pub const DEFAULT_PROXY_PORT: u16 = 9009;

/// The extension's own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `FLIGHTLOCK_PROXY_PORT`. Default 9009.
    pub proxy_port: u16,
    /// `FLIGHTLOCK_UPSTREAM`, else `AWS_LAMBDA_RUNTIME_API`, as `host:port` (scheme stripped).
    /// `None` if neither is set.
    pub upstream: Option<String>,
    /// `FLIGHTLOCK_WRAPPER_CHECK`. Default on.
    pub wrapper_check: bool,
    /// What callers of the lock API must send: `AWS_SESSION_TOKEN`, else (SnapStart)
    /// `AWS_CONTAINER_AUTHORIZATION_TOKEN`. `None` (neither set, as under some local
    /// emulators): every call is refused, saying why.
    pub api_token: Option<String>,
}

fn err(variable: &str, value: &str, problem: impl Into<String>, accepted: &str) -> ConfigError {
    ConfigError {
        variable: variable.to_owned(),
        value: value.to_owned(),
        problem: problem.into(),
        accepted: accepted.to_owned(),
    }
}

impl Settings {
    /// Parses the extension's settings from an environment map (empty values count as unset, as
    /// in [`flightlock_lambda::config::Config::from_map`]).
    pub fn from_map(env: &HashMap<String, String>) -> Result<Settings, ConfigError> {
        let proxy_port = match value(env, PROXY_PORT) {
            None => DEFAULT_PROXY_PORT,
            // Digits only, as the wrapper script accepts them (`u16::from_str` would also take
            // a leading `+`, which the wrapper rejects: the two must agree on every value).
            Some(v) => match v.parse::<u16>() {
                Ok(p) if p > 0 && v.bytes().all(|b| b.is_ascii_digit()) => p,
                _ => return Err(err(PROXY_PORT, &v, "not a port", "a TCP port 1-65535")),
            },
        };
        let upstream = match (value(env, UPSTREAM), value(env, RUNTIME_API)) {
            (Some(v), _) => Some(
                runtime_api_authority(&v)
                    .map_err(|p| err(UPSTREAM, &v, p, "host:port or http://host:port"))?,
            ),
            (None, Some(v)) => Some(
                runtime_api_authority(&v)
                    .map_err(|p| err(RUNTIME_API, &v, p, "host:port or http://host:port"))?,
            ),
            (None, None) => None,
        };
        let wrapper_check = match value(env, WRAPPER_CHECK) {
            None => true,
            Some(v) => parse_switch(&v)
                .map_err(|_| err(WRAPPER_CHECK, &v, "not a switch", SWITCH_FORMS))?,
        };
        Ok(Settings {
            proxy_port,
            upstream,
            wrapper_check,
            api_token: value(env, SESSION_TOKEN).or_else(|| value(env, CONTAINER_TOKEN)),
        })
    }
}

/// Strips an optional `http://` scheme and a trailing `/` from a Runtime API address and checks
/// that what is left looks like `host:port`.
pub fn runtime_api_authority(value: &str) -> Result<String, String> {
    let v = value.trim();
    let rest = match v.split_once("://") {
        None => v,
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
        Some((scheme, _)) => {
            return Err(format!(
                "scheme {scheme:?} is not supported (the Runtime API is plain HTTP)"
            ))
        }
    };
    let rest = rest.trim_end_matches('/');
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err("no port".into());
    };
    if host.is_empty() || rest.contains('/') || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err("not host:port".into());
    }
    Ok(rest.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults() {
        let s = Settings::from_map(&map(&[(RUNTIME_API, "127.0.0.1:9001")])).unwrap();
        assert_eq!(s.proxy_port, 9009);
        assert_eq!(s.upstream.as_deref(), Some("127.0.0.1:9001"));
        assert!(s.wrapper_check);
        assert_eq!(s.api_token, None);
        assert_eq!(Settings::from_map(&map(&[])).unwrap().upstream, None);
    }

    #[test]
    fn every_setting() {
        let s = Settings::from_map(&map(&[
            (RUNTIME_API, "127.0.0.1:9001"),
            (PROXY_PORT, "9100"),
            (UPSTREAM, "http://127.0.0.1:9200/"),
            (WRAPPER_CHECK, "off"),
            (SESSION_TOKEN, "IQoJb3JpZ2luX2Vj"),
        ]))
        .unwrap();
        assert_eq!(s.api_token.as_deref(), Some("IQoJb3JpZ2luX2Vj"));
        assert_eq!(s.proxy_port, 9100);
        assert_eq!(s.upstream.as_deref(), Some("127.0.0.1:9200"));
        assert!(!s.wrapper_check);
    }

    #[test]
    fn under_snapstart_the_container_token_is_the_lock_apis_secret() {
        // SnapStart: no AWS_SESSION_TOKEN, the container credentials' token instead.
        let s = Settings::from_map(&map(&[(CONTAINER_TOKEN, "container-token")])).unwrap();
        assert_eq!(s.api_token.as_deref(), Some("container-token"));
        // Both set: the session token, as every client sends it first.
        let s = Settings::from_map(&map(&[(CONTAINER_TOKEN, "c"), (SESSION_TOKEN, "s")])).unwrap();
        assert_eq!(s.api_token.as_deref(), Some("s"));
    }

    #[test]
    fn every_bad_value_names_its_variable_and_the_accepted_forms() {
        let cases: &[(&str, &str, &str)] = &[
            (PROXY_PORT, "70000", "1-65535"),
            (PROXY_PORT, "0", "1-65535"),
            (UPSTREAM, "https://x:1", "host:port"),
            (UPSTREAM, "localhost", "host:port"),
            (WRAPPER_CHECK, "sometimes", "on, off"),
        ];
        for (var, value, accepted) in cases {
            let e = Settings::from_map(&map(&[(RUNTIME_API, "127.0.0.1:9001"), (var, value)]))
                .unwrap_err();
            assert_eq!(e.variable, *var, "{var}={value}: {e}");
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("{var}=")), "{msg}");
            assert!(msg.contains(accepted), "{var}={value}: {msg}");
        }
    }

    #[test]
    fn runtime_api_is_accepted_with_or_without_a_scheme() {
        for v in [
            "127.0.0.1:9001",
            "http://127.0.0.1:9001",
            "HTTP://127.0.0.1:9001/",
        ] {
            assert_eq!(runtime_api_authority(v).unwrap(), "127.0.0.1:9001");
        }
        assert!(runtime_api_authority("127.0.0.1").is_err());
        assert!(runtime_api_authority("127.0.0.1:9001/path").is_err());
        let e = Settings::from_map(&map(&[(RUNTIME_API, "bogus")])).unwrap_err();
        assert_eq!(e.variable, RUNTIME_API);
    }
}
