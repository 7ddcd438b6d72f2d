//! Rate-limit response headers: draft-ietf-httpapi-ratelimit-headers-10 and the legacy
//! `X-RateLimit-*` trio.

use std::{fmt::Write as _, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use redlimit::{Decision, Decisions, PolicySet, Reason, RetryAfter};

/// Which rate-limit headers responses carry; see
/// [`RateLimitLayer::headers`](crate::RateLimitLayer::headers).
///
/// ```
/// use tower_redlimit::HeaderStyle;
///
/// assert_eq!("both".parse::<HeaderStyle>()?, HeaderStyle::IetfAndLegacy);
/// assert_eq!(HeaderStyle::default(), HeaderStyle::Ietf);
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
    #[default]
    Ietf,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (seconds).
    Legacy,
    /// Both of the above (`both` in the demo's TOML).
    IetfAndLegacy,
    /// None (denials still carry `Retry-After`).
    None,
}

impl std::str::FromStr for HeaderStyle {
    type Err = redlimit::ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ietf" => Ok(Self::Ietf),
            "legacy" => Ok(Self::Legacy),
            "both" => Ok(Self::IetfAndLegacy),
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

/// The `RateLimit-Policy` value of `policies` and their concurrency limit, the same on every
/// response: `"name";q=100;w=60, "in-flight";q=5;qu="concurrent-requests"`.
pub(crate) fn policy_value(policies: &PolicySet) -> HeaderValue {
    policy_value_of(policies, None)
}

/// The `RateLimit-Policy` value for a client whose `decisions` report other limits than
/// `policies` (a per-client override).
pub(crate) fn policy_value_of(policies: &PolicySet, decisions: Option<&Decisions>) -> HeaderValue {
    let mut value = String::new();
    for (i, p) in policies.iter().enumerate() {
        let separator = if value.is_empty() { "" } else { ", " };
        let (quota, window) = match decisions.and_then(|d| d.get(i)) {
            Some(d) => quota(d.limit, d.window, d.burst),
            None => quota(p.limit(), p.window(), p.burst()),
        };
        let _ = write!(
            value,
            "{separator}\"{}\";q={quota};w={}",
            p.name(),
            seconds_up(window)
        );
    }
    if let Some(p) = policies.concurrency() {
        let _ = write!(
            value,
            ", \"{}\";q={};qu=\"concurrent-requests\"",
            p.name(),
            p.limit()
        );
    }
    // Policy names are limited to A-Z a-z 0-9 _ - . and the rest are digits: always valid.
    HeaderValue::try_from(value).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The quota a policy states (`q`, and `X-RateLimit-Limit`) while `limit`, `window` and
/// `burst` are in force, and the time it spans (`w`): the limit per window; or, for a token
/// bucket or GCRA whose burst is not its limit, the burst and the time the whole burst takes to
/// refill (burst × window / limit), so that `r`, at most the burst, never exceeds `q`.
pub(crate) fn quota(limit: u64, window: Duration, burst: u64) -> (u64, Duration) {
    let quota = burst;
    if quota == limit || limit == 0 {
        return (quota, window);
    }
    let refill_ms = window.as_millis() * u128::from(quota) / u128::from(limit);
    let refill = Duration::from_millis(u64::try_from(refill_ms).unwrap_or(u64::MAX));
    (quota, refill)
}

/// Adds the headers of `style` for `decisions` (one per policy of `policies`, in order) that
/// `headers` does not have yet; `policy` is the policies' [`policy_value`]. Decisions of the
/// failure policy's open or closed answer get none: the limiter never saw that quota.
pub(crate) fn add(
    headers: &mut HeaderMap,
    style: HeaderStyle,
    policy: &HeaderValue,
    decisions: &Decisions,
) {
    // One path decides every policy of a check: the first decision's reason is theirs.
    if decisions
        .first()
        .is_some_and(|d| matches!(d.reason, Reason::FailOpen | Reason::FailClosed))
    {
        return;
    }
    if matches!(style, HeaderStyle::Ietf | HeaderStyle::IetfAndLegacy) {
        headers
            .entry(RATELIMIT_POLICY)
            .or_insert_with(|| policy.clone());
        if let http::header::Entry::Vacant(entry) = headers.entry(RATELIMIT)
            && let Ok(state) = HeaderValue::from_maybe_shared(state_value(decisions))
        {
            entry.insert(state);
        }
    }
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::IetfAndLegacy) {
        let d = decisions.most_restrictive();
        let limit = quota(d.limit, d.window, d.burst).0;
        headers
            .entry(X_LIMIT)
            .or_insert_with(|| HeaderValue::from(limit));
        headers
            .entry(X_REMAINING)
            .or_insert_with(|| HeaderValue::from(d.remaining));
        headers
            .entry(X_RESET)
            .or_insert_with(|| HeaderValue::from(reset_secs(d)));
    }
}

/// A decision's `t` (and `X-RateLimit-Reset`): when its quota is usable again. For a policy
/// that denied (or, in shadow mode, would have), that is its own `retry_after`, so `t` matches
/// `Retry-After` as draft-ietf-httpapi-ratelimit-headers-10 asks; else the wait until the whole
/// quota is back.
fn reset_secs(d: &Decision) -> u64 {
    match d.retry_after {
        Some(RetryAfter::After(wait)) => seconds_up(wait),
        _ => seconds_up(d.reset_after),
    }
}

/// The `RateLimit` value: `"name";r=99;t=60, …`. Built by hand into a buffer of the exact
/// length, which becomes the value without a copy: this runs on every response.
fn state_value(decisions: &[Decision]) -> Bytes {
    let separators = 2 * decisions.len().saturating_sub(1);
    let length = decisions.iter().fold(separators, |n, d| {
        n + d.policy.len() + "\"\";r=;t=".len() + digits(d.remaining) + digits(reset_secs(d))
    });
    let mut value = Vec::with_capacity(length);
    for (i, d) in decisions.iter().enumerate() {
        if i > 0 {
            value.extend_from_slice(b", ");
        }
        value.push(b'"');
        value.extend_from_slice(d.policy.as_bytes());
        value.extend_from_slice(b"\";r=");
        value.extend_from_slice(itoa::Buffer::new().format(d.remaining).as_bytes());
        value.extend_from_slice(b";t=");
        value.extend_from_slice(itoa::Buffer::new().format(reset_secs(d)).as_bytes());
    }
    debug_assert_eq!(value.len(), length);
    Bytes::from(value)
}

/// How many decimal digits `n` has.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
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
    fn digits_are_counted_in_full() {
        for n in [0, 7, 9, 10, 42, 99, 100, 1_000_000, u64::MAX] {
            assert_eq!(digits(n), n.to_string().len());
        }
    }
}
