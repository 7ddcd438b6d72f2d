use std::{borrow::Cow, fmt, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header, request::Parts};
use redlimit::{
    BlockCache, CircuitBreaker, Clock, ConfigError, Decision, FailurePolicy, GuardedLimiter,
    Limiter, Policy,
};
use tower_layer::Layer;

use crate::{
    ClientIp, HeaderStyle, KeyExtractor, RateLimit, headers,
    response::{Rejected, default_response},
};

/// What to do with a request the key extractor finds no key for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer with this status and a message, without calling the service.
    Reject(StatusCode),
    /// Let it through unlimited.
    Allow,
    /// Limit all such requests together under this key (such as `anonymous`).
    Shared(String),
}

impl Default for MissingKey {
    /// `Reject(500)`: a missing peer address is a server set-up mistake, not the client's.
    fn default() -> Self {
        Self::Reject(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;
type RejectionFn = dyn Fn(&Rejected<'_>) -> Response<Bytes> + Send + Sync;

/// Rate-limits the wrapped service: the layer and its builder.
///
/// Every request is keyed (by default [`ClientIp::peer`]), checked against all the layer's
/// policies in one round trip, and either passed on with the decision in its extensions and
/// rate-limit headers on the response, or answered with `429 Too Many Requests` (gRPC:
/// `RESOURCE_EXHAUSTED`) without calling the service. Readiness is the inner service's.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use redlimit::{Algorithm, Limiter, MemoryBackend, Policy};
/// use tower_redlimit::{HeaderStyle, RateLimitLayer};
///
/// let policy = Policy::builder("api", Algorithm::Gcra)
///     .limit(100)
///     .window(Duration::from_secs(60))
///     .build()?;
/// let layer = RateLimitLayer::new(Limiter::new(MemoryBackend::default()), [policy])?
///     .headers(HeaderStyle::Both)
///     .timeout(Duration::from_millis(20));
/// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Clone)]
#[must_use]
pub struct RateLimitLayer {
    pub(crate) guard: GuardedLimiter,
    key: Arc<dyn KeyExtractor>,
    cost: Arc<CostFn>,
    pub(crate) headers: HeaderStyle,
    /// The `RateLimit-Policy` value, the same on every response.
    pub(crate) policy_header: HeaderValue,
    problem_json: bool,
    rejection: Option<Arc<RejectionFn>>,
    missing_key: MissingKey,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("guard", &self.guard)
            .field("headers", &self.headers)
            .field("problem_json", &self.problem_json)
            .field("missing_key", &self.missing_key)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// Limits by `policies`, all checked together (a request passes only if every one allows
    /// it, and a denied request consumes from none), on `limiter`.
    ///
    /// # Errors
    /// [`ConfigError`] for no policy or a policy name given twice.
    pub fn new(
        limiter: Limiter,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Result<Self, ConfigError> {
        let guard = GuardedLimiter::new(limiter, policies)?;
        Ok(Self {
            policy_header: headers::policy_value(guard.policies()),
            guard,
            key: Arc::new(ClientIp::peer()),
            cost: Arc::new(|_: &Parts| 1),
            headers: HeaderStyle::default(),
            problem_json: false,
            rejection: None,
            missing_key: MissingKey::default(),
        })
    }

    /// Who is limited. Defaults to [`ClientIp::peer`].
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.key = Arc::new(key);
        self
    }

    /// How much a request costs. Defaults to 1 for every request; 0 lets a request through
    /// without consuming.
    pub fn cost(mut self, cost: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Arc::new(cost);
        self
    }

    /// What to answer when the backend fails. Defaults to [`FailurePolicy::Open`].
    pub fn failure(mut self, failure: FailurePolicy) -> Self {
        self.guard = self.guard.failure(failure);
        self
    }

    /// The most a check may wait for the backend before the failure policy answers. Defaults
    /// to 50 ms; `Duration::ZERO` leaves only the backend's own budget.
    pub fn timeout(mut self, budget: Duration) -> Self {
        self.guard = self.guard.budget(budget);
        self
    }

    /// Stops calling a failing backend for a while. Defaults to [`CircuitBreaker::default`].
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.guard = self.guard.circuit_breaker(breaker);
        self
    }

    /// Denies clients known to be over their limit without asking Redis, until the wait it
    /// reported is over; see [`BlockCache`]. Defaults to on (`BlockCache::default()`); `None`
    /// turns it off.
    pub fn block_cache(mut self, cache: Option<BlockCache>) -> Self {
        self.guard = self.guard.block_cache(cache);
        self
    }

    /// Which rate-limit headers responses carry. Defaults to [`HeaderStyle::Ietf`].
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.headers = style;
        self
    }

    /// Whether denials carry an `application/problem+json` body (RFC 9457). Defaults to a
    /// one-line text body.
    pub fn problem_json(mut self, enabled: bool) -> Self {
        self.problem_json = enabled;
        self
    }

    /// Builds the response to a denied request. `Retry-After` and the rate-limit headers are
    /// added to it unless it sets them. Defaults to 429 with a short body (gRPC:
    /// `grpc-status: 8`).
    pub fn rejection(
        mut self,
        respond: impl Fn(&Rejected<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.rejection = Some(Arc::new(respond));
        self
    }

    /// What to do when the key extractor finds no key. Defaults to [`MissingKey::Reject`]
    /// with 500.
    pub fn missing_key(mut self, missing: MissingKey) -> Self {
        self.missing_key = missing;
        self
    }

    /// Decides at the times `clock` gives instead of the backend's clock: for tests.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.guard = self.guard.clock(clock);
        self
    }

    /// The guarded limiter: its policies, counters and circuit breaker.
    pub fn guard(&self) -> &GuardedLimiter {
        &self.guard
    }

    /// The key of a request after the missing-key rule: `Ok(None)` lets it through unlimited,
    /// `Err` is the status to answer with.
    pub(crate) fn key_of<'a>(
        &'a self,
        parts: &'a Parts,
    ) -> Result<Option<Cow<'a, str>>, StatusCode> {
        match (self.key.extract(parts), &self.missing_key) {
            (Some(key), _) => Ok(Some(key)),
            (None, MissingKey::Allow) => Ok(None),
            (None, MissingKey::Shared(key)) => Ok(Some(Cow::Borrowed(key))),
            (None, MissingKey::Reject(status)) => Err(*status),
        }
    }

    pub(crate) fn missing_key_response(status: StatusCode) -> Response<Bytes> {
        let mut response = Response::new(Bytes::from_static(
            b"no rate-limit key for this request (is the peer address recorded?)\n",
        ));
        *response.status_mut() = status;
        response
    }

    pub(crate) fn cost_of(&self, parts: &Parts) -> u64 {
        (self.cost)(parts)
    }

    /// The response to a denied request, with `Retry-After` and the rate-limit headers; in
    /// gRPC's form when the request's headers say it is gRPC.
    pub(crate) fn reject(&self, decisions: &[Decision], request: &HeaderMap) -> Response<Bytes> {
        let grpc = request
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        let rejected = Rejected { decisions, grpc };
        let mut response = match &self.rejection {
            Some(respond) => respond(&rejected),
            None => default_response(&rejected, self.problem_json),
        };
        let response_headers = response.headers_mut();
        if let Some(secs) = rejected.retry_after_secs() {
            response_headers
                .entry(header::RETRY_AFTER)
                .or_insert_with(|| HeaderValue::from(secs));
        }
        let mut limit_headers = HeaderMap::new();
        headers::insert(
            &mut limit_headers,
            self.headers,
            &self.policy_header,
            decisions,
        );
        for (name, value) in &limit_headers {
            response_headers
                .entry(name)
                .or_insert_with(|| value.clone());
        }
        response
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit::new(inner, Arc::new(self.clone()))
    }
}
