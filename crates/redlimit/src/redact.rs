//! Redis URLs without their credentials, for logs, banners and `Debug`.

/// `url` with its user name and password replaced by `***`: `redis://:hunter2@cache:6379/2`
/// becomes `redis://***@cache:6379/2`. A URL without credentials comes back as it is; text that
/// is not a URL comes back with anything before an `@` hidden, in case it held a secret.
///
/// ```
/// assert_eq!(
///     redlimit::redacted_url("rediss://app:s3cret@cache.example:6380/1"),
///     "rediss://***@cache.example:6380/1"
/// );
/// assert_eq!(redlimit::redacted_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
/// ```
pub fn redacted_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let host = match authority.rfind('@') {
        Some(at) => format!("***@{}", &authority[at + 1..]),
        None => authority.to_owned(),
    };
    if scheme.is_empty() && !url.contains("://") {
        format!("{host}{path}")
    } else {
        format!("{scheme}://{host}{path}")
    }
}

#[cfg(test)]
mod tests {
    use super::redacted_url;

    #[test]
    fn credentials_are_hidden_and_the_rest_kept() {
        for (url, shown) in [
            (
                "redis://:hunter2@127.0.0.1:6379",
                "redis://***@127.0.0.1:6379",
            ),
            ("redis://user:pw@host:1/3", "redis://***@host:1/3"),
            ("redis://user@host", "redis://***@host"),
            ("redis://p@ss@host:1", "redis://***@host:1"),
            (
                "redis+unix:///tmp/redis.sock",
                "redis+unix:///tmp/redis.sock",
            ),
            ("garbage:secret@host", "***@host"),
            ("", ""),
        ] {
            assert_eq!(redacted_url(url), shown, "{url}");
        }
    }
}
