//! What the layer's tests share: their policy, and reading a denial.

use std::time::Duration;

use http::{Response, StatusCode};
use redlimit::{Algorithm, Policy};

/// `limit` per 10 minutes, the window opening at the first request: waits are exact.
pub(crate) fn policy(limit: u64) -> Policy {
    Policy::builder("p", Algorithm::FixedWindowAnchored)
        .limit(limit)
        .window(Duration::from_secs(600))
        .build()
        .expect("valid")
}

/// Asserts `response` is the denial of policy `p`: 429, its state and a wait of at most the
/// window.
pub(crate) fn assert_denied<B>(response: &Response<B>) {
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let state = response.headers()["ratelimit"].to_str().expect("text");
    assert!(state.starts_with("\"p\";r=0;t="), "{state}");
    let retry: u64 = response.headers()["retry-after"]
        .to_str()
        .expect("text")
        .parse()
        .expect("seconds");
    assert!((1..=600).contains(&retry), "{retry}");
}
