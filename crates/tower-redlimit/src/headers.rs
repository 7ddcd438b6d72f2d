//! Rate-limit response headers: draft-ietf-httpapi-ratelimit-headers-10 and the legacy
//! `X-RateLimit-*` trio.

use std::{fmt::Write as _, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use redlimit::{Decision, Policy, RetryAfter};

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
    #[default]
    Ietf,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (seconds).
    Legacy,
    /// Both.
    Both,
    /// None (denials still carry `Retry-After`).
    None,
}

impl std::str::FromStr for HeaderStyle {
    type Err = redlimit::ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ietf" => Ok(Self::Ietf),
            "legacy" => Ok(Self::Legacy),
            "both" => Ok(Self::Both),
            "none" => Ok(Self::None),
            _ => Err(redlimit::ConfigError::UnknownValue {
                field: "headers",
                value: s.to_owned(),
            }),
        }
    }
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Whole seconds, rounded up: a client that waits this long is never early.
pub(crate) fn seconds_up(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The decision a single-valued header reports: the first denial, else the least remaining.
pub fn most_restrictive(decisions: &[Decision]) -> Option<&Decision> {
    decisions
        .iter()
        .find(|d| !d.allowed)
        .or_else(|| decisions.iter().min_by_key(|d| d.remaining))
}

/// The seconds a denied client should wait, if any wait helps.
pub(crate) fn retry_after_secs(decisions: &[Decision]) -> Option<u64> {
    decisions
        .iter()
        .filter_map(|d| match d.retry_after {
            Some(RetryAfter::After(wait)) => Some(seconds_up(wait)),
            _ => None,
        })
        .max()
}

/// The `RateLimit-Policy` value of `policies`, which never changes: `"name";q=100;w=60, …`.
pub(crate) fn policy_value(policies: &[Policy]) -> HeaderValue {
    let mut value = String::new();
    for p in policies {
        let separator = if value.is_empty() { "" } else { ", " };
        let _ = write!(
            value,
            "{separator}\"{}\";q={};w={}",
            p.name(),
            p.limit(),
            seconds_up(p.window())
        );
    }
    // Policy names are limited to A-Z a-z 0-9 _ - . and the rest are digits: always valid.
    HeaderValue::try_from(value).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Adds the headers of `style` for `decisions` (one per policy, in order); `policy` is the
/// policies' [`policy_value`].
pub(crate) fn insert(
    headers: &mut HeaderMap,
    style: HeaderStyle,
    policy: &HeaderValue,
    decisions: &[Decision],
) {
    if matches!(style, HeaderStyle::Ietf | HeaderStyle::Both)
        && let Ok(state) = HeaderValue::from_maybe_shared(state_value(decisions))
    {
        headers.insert(RATELIMIT_POLICY, policy.clone());
        headers.insert(RATELIMIT, state);
    }
    let legacy = matches!(style, HeaderStyle::Legacy | HeaderStyle::Both);
    if let Some(d) = most_restrictive(decisions).filter(|_| legacy) {
        headers.insert(X_LIMIT, HeaderValue::from(d.limit));
        headers.insert(X_REMAINING, HeaderValue::from(d.remaining));
        headers.insert(X_RESET, HeaderValue::from(seconds_up(d.reset_after)));
    }
}

/// The `RateLimit` value: `"name";r=99;t=60, …`. Built by hand into a buffer of the exact
/// length, which becomes the value without a copy: this runs on every response.
fn state_value(decisions: &[Decision]) -> Bytes {
    let separators = 2 * decisions.len().saturating_sub(1);
    let length = decisions.iter().fold(separators, |n, d| {
        n + d.policy.len()
            + "\"\";r=;t=".len()
            + digits(d.remaining)
            + digits(seconds_up(d.reset_after))
    });
    let mut value = Vec::with_capacity(length);
    for (i, d) in decisions.iter().enumerate() {
        if i > 0 {
            value.extend_from_slice(b", ");
        }
        value.push(b'"');
        value.extend_from_slice(d.policy.as_bytes());
        value.extend_from_slice(b"\";r=");
        push_number(&mut value, d.remaining);
        value.extend_from_slice(b";t=");
        push_number(&mut value, seconds_up(d.reset_after));
    }
    debug_assert_eq!(value.len(), length);
    Bytes::from(value)
}

/// How many decimal digits `n` has.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

fn push_number(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [b'0'; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] += u8::try_from(n % 10).unwrap_or(0);
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up_to_whole_seconds() {
        assert_eq!(seconds_up(Duration::ZERO), 0);
        assert_eq!(seconds_up(Duration::from_millis(1)), 1);
        assert_eq!(seconds_up(Duration::from_millis(1000)), 1);
        assert_eq!(seconds_up(Duration::from_millis(1001)), 2);
    }

    #[test]
    fn numbers_are_written_in_full() {
        for n in [0, 7, 9, 10, 42, 99, 100, 1_000_000, u64::MAX] {
            let mut out = Vec::new();
            push_number(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
            assert_eq!(digits(n), out.len());
        }
    }
}
