//! Redis URLs checked when a backend is built, so a mistake is named before the first request.

use crate::ConfigError;

/// What a Redis URL should look like, for messages about one that does not.
const EXPECTED_URL: &str =
    "expected redis://[user:password@]host[:port][/db], rediss://... for TLS, or unix:///path";

/// Refuses a URL that cannot name a Redis server, saying why in words for whoever wrote it
/// (never repeating the URL, which may hold a password).
pub(crate) fn check_url(field: &'static str, url: &str) -> Result<(), ConfigError> {
    let problem = |message: String| ConfigError::Redis { field, message };
    let Some((scheme, rest)) = url.trim().split_once("://") else {
        return Err(problem(format!("no scheme: {EXPECTED_URL}")));
    };
    match scheme {
        "redis" | "rediss" => {}
        "unix" | "redis+unix" => return Ok(()),
        other => {
            let other: String = other.chars().take(16).collect();
            return Err(problem(format!(
                "unsupported scheme {other:?}: {EXPECTED_URL}"
            )));
        }
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, at)| at);
    let port = match host_port.strip_prefix('[') {
        Some(v6) => v6
            .split_once(']')
            .and_then(|(_, after)| after.strip_prefix(':')),
        None => host_port.split_once(':').map(|(_, port)| port),
    };
    let host = host_port.split(':').next().unwrap_or_default();
    if host.is_empty() {
        return Err(problem(format!("no host: {EXPECTED_URL}")));
    }
    match port.map(str::parse::<u16>) {
        None | Some(Ok(1..)) => Ok(()),
        Some(_) => Err(problem(format!(
            "the port is not a number from 1 to 65535: {EXPECTED_URL}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(url: &str) -> String {
        check_url("redis url", url).expect_err(url).to_string()
    }

    #[test]
    fn each_mistake_is_named_and_the_url_is_never_repeated() {
        assert!(message("127.0.0.1:6379").starts_with("redis url: no scheme: expected redis://"));
        assert!(message("http://127.0.0.1:6379").contains("unsupported scheme \"http\""));
        assert!(message("redis://:secret@127.0.0.1:99999").contains("the port is not a number"));
        assert!(message("redis://127.0.0.1:x").contains("the port is not a number"));
        assert!(message("redis://").contains("no host"));
        assert!(!message("redis://:secret@h:0").contains("secret"));
        for good in [
            "redis://127.0.0.1:6379",
            "redis://127.0.0.1",
            "rediss://user:pw@cache.internal:6380/2",
            "redis://[::1]:6379",
            "unix:///run/redis.sock",
        ] {
            assert!(check_url("redis url", good).is_ok(), "{good}");
        }
    }
}
