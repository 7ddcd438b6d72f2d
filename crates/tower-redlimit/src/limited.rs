//! A check made in a handler, answered as the layer answers.

use bytes::Bytes;
use http::{HeaderMap, Response};
use redlimit::{Decisions, PolicySet};

use crate::{
    HeaderStyle,
    headers::{self, policy_value_of},
    response::{Rejected, default_response, with_retry_after},
};

/// The decisions of a check made outside the layer (in a handler, by a key the layer cannot
/// see, such as a user name in a JSON body), answered exactly as the layer answers: the
/// rate-limit headers of its own policies on any response, and when it is denied a 429 (503
/// when the limiter failed closed) with `Retry-After`. With the `axum` feature it is a response
/// (`IntoResponse`) and response parts (`IntoResponseParts`: the headers on an allowed
/// response); with `tonic`, it converts into a `RESOURCE_EXHAUSTED` status.
///
/// Headers a handler's response carries are kept by a layer further out, so a client sees
/// this check's numbers, not an outer layer's.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, GuardedLimiter, Limiter, MemoryBackend, Policy};
/// use tower_redlimit::Limited;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let logins = Policy::builder("logins", Algorithm::FixedWindow)
///     .limit(1)
///     .window(Duration::from_secs(60))
///     .build()?;
/// let guard = GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), logins).build();
/// guard.check("ann").await;
/// let again = Limited::new(guard.policies(), guard.check("ann").await);
/// assert!(!again.allowed());
/// let response = again.into_http();
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["ratelimit-policy"], "\"logins\";q=1;w=60");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Limited {
    decisions: Decisions,
    policies: PolicySet,
    headers: HeaderStyle,
    problem_json: bool,
}

impl Limited {
    /// The `decisions` of a check of `policies` (a guard's
    /// [`policies`](redlimit::GuardedLimiter::policies)).
    pub fn new(policies: &PolicySet, decisions: Decisions) -> Self {
        Self {
            decisions,
            policies: policies.clone(),
            headers: HeaderStyle::default(),
            problem_json: false,
        }
    }

    /// Which rate-limit headers to write. Defaults to [`HeaderStyle::Ietf`], as the layer.
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.headers = style;
        self
    }

    /// Whether a denial's body is `application/problem+json`. Defaults to `false`, as the
    /// layer.
    pub fn problem_json(mut self, enabled: bool) -> Self {
        self.problem_json = enabled;
        self
    }

    /// Whether every policy admitted the request.
    pub fn allowed(&self) -> bool {
        self.decisions.allowed()
    }

    /// The check's decisions.
    pub fn decisions(&self) -> &Decisions {
        &self.decisions
    }

    /// Adds this check's rate-limit headers to `headers` where they are not set yet.
    pub fn add_headers(&self, headers: &mut HeaderMap) {
        // Per client: an override's numbers are the client's own.
        let policy = policy_value_of(&self.policies, Some(&self.decisions));
        headers::add(headers, self.headers, &policy, &self.decisions);
    }

    /// The denial the layer would answer (429, or 503 when the limiter failed closed), with
    /// `Retry-After` and the rate-limit headers; for an allowed check, an empty 200 with the
    /// headers.
    pub fn into_http(self) -> Response<Bytes> {
        let mut response = if self.allowed() {
            Response::new(Bytes::new())
        } else {
            let rejected = Rejected {
                decisions: &self.decisions,
                grpc: false,
            };
            with_retry_after(default_response(&rejected, self.problem_json), &rejected)
        };
        self.add_headers(response.headers_mut());
        response
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for Limited {
    fn into_response(self) -> axum::response::Response {
        self.into_http().map(axum::body::Body::from)
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponseParts for Limited {
    type Error = std::convert::Infallible;

    fn into_response_parts(
        self,
        mut parts: axum::response::ResponseParts,
    ) -> Result<axum::response::ResponseParts, Self::Error> {
        self.add_headers(parts.headers_mut());
        Ok(parts)
    }
}

#[cfg(feature = "tonic")]
impl From<Limited> for tonic::Status {
    /// `RESOURCE_EXHAUSTED` (`UNAVAILABLE` when the limiter failed closed) with the layer's
    /// message; the rate-limit headers as the status's metadata.
    fn from(limited: Limited) -> Self {
        let rejected = Rejected {
            decisions: &limited.decisions,
            grpc: true,
        };
        let code = if rejected.status() == http::StatusCode::SERVICE_UNAVAILABLE {
            tonic::Code::Unavailable
        } else {
            tonic::Code::ResourceExhausted
        };
        let mut headers = HeaderMap::new();
        limited.add_headers(&mut headers);
        tonic::Status::with_metadata(
            code,
            rejected.message(),
            tonic::metadata::MetadataMap::from_headers(headers),
        )
    }
}
