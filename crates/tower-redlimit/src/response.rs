//! What a limited request gets back.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header, request::Parts};
use redlimit::{Decisions, Reason, RetryAfter};

use crate::headers::seconds_up;

/// A request the limiter turned away, for building its response; see
/// [`RateLimitLayer::rejection`](crate::RateLimitLayer::rejection).
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http::{Response, StatusCode};
/// use redlimit::{Algorithm, GuardedLimiter, Limiter, MemoryBackend, Policy};
/// use tower_redlimit::{RateLimitLayer, Rejected};
///
/// let policy = Policy::builder("api", Algorithm::Gcra)
///     .limit(10)
///     .window(Duration::from_secs(1))
///     .build()?;
/// let layer = RateLimitLayer::new(GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), policy).build())
///     .rejection(|rejected: &Rejected<'_>| {
///         let mut response = Response::new(Bytes::from(format!("slow down: {}", rejected.message())));
///         *response.status_mut() = rejected.status();
///         response
///     });
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Rejected<'a> {
    /// One decision per policy; at least one is denied.
    pub decisions: &'a Decisions,
    /// Whether the request is gRPC (`content-type: application/grpc…`).
    pub grpc: bool,
}

impl Rejected<'_> {
    /// The status the default response uses: `503 Service Unavailable` when the limiter failed
    /// closed (the client is not over its limit; the limiter could not tell), else
    /// `429 Too Many Requests`.
    pub fn status(&self) -> StatusCode {
        if self
            .decisions
            .iter()
            .any(|d| d.reason == Reason::FailClosed)
        {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::TOO_MANY_REQUESTS
        }
    }

    /// Seconds until the request could pass (rounded up), or `None` when it never can.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self.decisions.retry_after() {
            Some(RetryAfter::After(wait)) => Some(seconds_up(wait)),
            _ => None,
        }
    }

    /// A one-line explanation.
    pub fn message(&self) -> String {
        let denied = self.decisions.most_restrictive();
        let policy = &*denied.policy;
        match (self.status(), denied.retry_after) {
            (StatusCode::SERVICE_UNAVAILABLE, _) => {
                "rate limiter unavailable; try again later".to_owned()
            }
            (_, Some(RetryAfter::Never)) => {
                format!("request cost exceeds what policy {policy} can ever allow")
            }
            _ => match self.retry_after_secs() {
                Some(secs) => format!("rate limit {policy} exceeded; retry after {secs} s"),
                None => format!("rate limit {policy} exceeded"),
            },
        }
    }
}

/// The default response: gRPC status 8 (`RESOURCE_EXHAUSTED`) for gRPC, else 429 (or 503) with
/// a short text body, or an `application/problem+json` body when asked.
pub(crate) fn default_response(rejected: &Rejected<'_>, problem_json: bool) -> Response<Bytes> {
    let message = rejected.message();
    if rejected.grpc {
        return grpc_answer("8", &message);
    }
    let retry = rejected
        .retry_after_secs()
        .map_or_else(String::new, |secs| format!(",\"retry_after\":{secs}"));
    let policy = &*rejected.decisions.most_restrictive().policy;
    let members = format!(",\"policy\":\"{policy}\"{retry}");
    answer(
        rejected.status(),
        &message,
        problem_json.then_some(&members),
    )
}

/// `response` to `rejected` with its `Retry-After`, unless it has one already.
pub(crate) fn with_retry_after(
    mut response: Response<Bytes>,
    rejected: &Rejected<'_>,
) -> Response<Bytes> {
    if let Some(secs) = rejected.retry_after_secs() {
        response
            .headers_mut()
            .entry(header::RETRY_AFTER)
            .or_insert_with(|| HeaderValue::from(secs));
    }
    response
}

/// The answer to `request` the limiter refuses for itself (no key to limit it by): `status`
/// saying `message`, in the format of a denial; gRPC's `INVALID_ARGUMENT` for a 4xx, else
/// `INTERNAL`.
pub(crate) fn refusal(
    request: &Parts,
    status: StatusCode,
    message: &str,
    problem_json: bool,
) -> Response<Bytes> {
    if is_grpc(&request.headers) {
        let code = if status.is_client_error() { "3" } else { "13" };
        return grpc_answer(code, message);
    }
    answer(status, message, problem_json.then_some(""))
}

/// Whether `headers` are a gRPC request's (`content-type: application/grpc…`).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A gRPC answer without a body: `code` and `message` in its headers.
fn grpc_answer(code: &'static str, message: &str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from_static(code));
    if let Ok(message) = HeaderValue::try_from(message) {
        headers.insert("grpc-message", message);
    }
    response
}

/// `status` saying `message`: a line of text, or with `problem` (the members beyond `type`,
/// `title`, `status` and `detail`, each led by a comma) an `application/problem+json` body.
fn answer(status: StatusCode, message: &str, problem: Option<&str>) -> Response<Bytes> {
    let (content_type, body) = match problem {
        Some(members) => (
            "application/problem+json",
            format!(
                "{{\"type\":\"about:blank\",\"title\":\"{}\",\"status\":{},\"detail\":\"{}\"{members}}}",
                status.canonical_reason().unwrap_or_default(),
                status.as_u16(),
                json_text(message),
            ),
        ),
        None => ("text/plain; charset=utf-8", format!("{message}\n")),
    };
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// `text` as the inside of a JSON string: a key extractor's own description may hold quotes.
fn json_text(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => escaped.push_str("\\\""),
            '\\' => escaped.push_str("\\\\"),
            c if c.is_control() => escaped.push(' '),
            c => escaped.push(c),
        }
    }
    escaped
}
