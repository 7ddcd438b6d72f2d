use std::{fmt, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Response, StatusCode, request::Parts};
use redlimit::GuardedLimiter;
use tower_layer::Layer;

use crate::{
    AccessList, ClientIp, HeaderStyle, KeyExtractor, MissingKey, RateLimit, Rejected, Served,
    http_metrics::HttpSeries,
    runtime::{ChooseFn, Guarded, Runtime, Settings},
    waiting_room::Waiters,
};

/// Rate-limits the wrapped service: the layer and its builder.
///
/// Every request is keyed (by default [`ClientIp::peer`]), checked by a
/// [`GuardedLimiter`] against all its policies in one round trip, and either passed on with the
/// check's [`Decisions`](redlimit::Decisions) in its extensions (the most restrictive:
/// [`Decisions::most_restrictive`](redlimit::Decisions::most_restrictive)) and rate-limit headers on
/// the response, or answered with `429 Too Many Requests` (gRPC: `RESOURCE_EXHAUSTED`) without
/// calling the service. The guard holds what happens when the backend fails: its budget,
/// failure policy, circuit breaker and block cache. Readiness is the inner service's.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use redlimit::{Algorithm, FailurePolicy, GuardedLimiter, Limiter, MemoryBackend, Policy};
/// use tower_redlimit::{HeaderStyle, RateLimitLayer};
///
/// let policy = Policy::builder("api", Algorithm::Gcra)
///     .limit(100)
///     .window(Duration::from_secs(60))
///     .build()?;
/// let guard = GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), policy)
///     .failure(FailurePolicy::local())
///     .budget(Duration::from_millis(20))
///     .build();
/// let layer = RateLimitLayer::new(guard).headers(HeaderStyle::IetfAndLegacy);
/// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Clone)]
#[must_use]
pub struct RateLimitLayer {
    settings: Settings,
    guard: Guarded,
    tiers: Vec<Guarded>,
    choose: Option<Arc<ChooseFn>>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let settings = &self.settings;
        f.debug_struct("RateLimitLayer")
            .field("guard", &self.guard.0)
            .field("tiers", &self.tiers.len())
            .field("headers", &settings.headers)
            .field("problem_json", &settings.problem_json)
            .field("missing_key", &settings.missing_key)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// Limits by `guard`'s policies, all checked together: a request passes only if every one
    /// allows it, and a denied request consumes from none.
    pub fn new(guard: GuardedLimiter) -> Self {
        Self {
            settings: Settings::new(Arc::new(ClientIp::peer()), &guard),
            guard: guarded(guard),
            tiers: Vec::new(),
            choose: None,
        }
    }

    fn settings(&mut self) -> &mut Settings {
        &mut self.settings
    }

    /// Who is limited. Defaults to [`ClientIp::peer`].
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.settings().set_key(Arc::new(key));
        self
    }

    /// Keys the guard's policy named `policy` by `key` instead of the layer's
    /// [`key`](Self::key): per IP and per API key in one layer, one check, all or nothing
    /// (see [`CheckRequest::keys`](redlimit::CheckRequest::keys)), one time budget and one
    /// request id; the response's headers list every policy. A request without this key
    /// follows [`missing_key`](Self::missing_key). Defaults to the layer's key for every policy.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{Algorithm, GuardedLimiter, Limiter, MemoryBackend, Policy, PolicySet};
    /// use tower_redlimit::{ClientIp, HeaderKey, RateLimitLayer};
    ///
    /// let per_minute = |name, limit| {
    ///     Policy::builder(name, Algorithm::SlidingWindowCounter)
    ///         .limit(limit)
    ///         .window(Duration::from_secs(60))
    ///         .build()
    /// };
    /// let both = PolicySet::new([per_minute("per-ip", 100)?, per_minute("per-key", 1_000)?])?;
    /// let guard = GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), both).build();
    /// let layer = RateLimitLayer::new(guard)
    ///     .key(ClientIp::peer()) // per-ip, and any policy not named below
    ///     .key_for("per-key", HeaderKey::new("x-api-key")?)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::UnknownValue`](redlimit::ConfigError::UnknownValue) naming `policy` when
    /// the guard has no policy of that name.
    pub fn key_for(
        mut self,
        policy: &str,
        key: impl KeyExtractor,
    ) -> Result<Self, redlimit::ConfigError> {
        if !self.guard.0.policies().iter().any(|p| p.name() == policy) {
            return Err(redlimit::ConfigError::UnknownValue {
                field: "key_for policy",
                value: policy.to_owned(),
            });
        }
        let keys = &mut self.settings().keys_for;
        keys.retain(|(name, _)| name != policy);
        keys.push((policy.to_owned(), Arc::new(key)));
        Ok(self)
    }

    /// How much a request costs. Defaults to 1 for every request; 0 lets a request through
    /// without consuming.
    pub fn cost(mut self, cost: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.settings().cost = Arc::new(cost);
        self
    }

    /// Which rate-limit headers responses carry. Defaults to [`HeaderStyle::Ietf`].
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.settings().headers = style;
        self
    }

    /// Whether denials carry an `application/problem+json` body (RFC 9457). Defaults to a
    /// one-line text body.
    pub fn problem_json(mut self, enabled: bool) -> Self {
        self.settings().problem_json = enabled;
        self
    }

    /// Builds the response to a denied request. `Retry-After` and the rate-limit headers are
    /// added to it unless it sets them. Defaults to 429 with a short body (gRPC:
    /// `grpc-status: 8` and no body).
    ///
    /// The body is written in the service's own body type: in full for axum's body (feature
    /// `axum`), `http_body_util::Full<Bytes>`, `String` and `Bytes`; for any other type
    /// (a boxed body, tower-http's compression body when the layer is outside compression)
    /// the denial carries that type's default, empty body, and its status and headers. To send
    /// text with such a type, put the layer inside the layer that changes the body type, or map
    /// the response after it.
    pub fn rejection(
        mut self,
        respond: impl Fn(&Rejected<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.settings().rejection = Some(Arc::new(respond));
        self
    }

    /// Clients served without any limit and without a backend call (partners, health checkers,
    /// your own offices). The deny list is checked first. Defaults to none.
    pub fn allow(mut self, list: AccessList) -> Self {
        self.settings().allow = Some(list);
        self
    }

    /// Clients answered with [`deny_status`](Self::deny_status) (403 by default) without a
    /// backend call and without calling the service. Defaults to none.
    pub fn deny(mut self, list: AccessList) -> Self {
        self.settings().deny = Some(list);
        self
    }

    /// The status of a request on the [`deny`](Self::deny) list. Defaults to 403 Forbidden.
    pub fn deny_status(mut self, status: StatusCode) -> Self {
        self.settings().deny_status = status;
        self
    }

    /// Limits chosen per request: `choose` looks at the request and its key and names one of
    /// `tiers` by its position (an API key's plan, a method, a route); a request it names none
    /// for, or a position past the end, is limited by the layer's own guard. Each tier is a
    /// [`GuardedLimiter`], its policies validated when it was built, never per request; keys,
    /// headers and lists are the layer's. Defaults to none.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{Algorithm, GuardedLimiter, Limiter, MemoryBackend, Policy};
    /// use tower_redlimit::{HeaderKey, RateLimitLayer};
    ///
    /// let limiter = Limiter::new(MemoryBackend::default());
    /// let per_minute = |name: &str, limit| {
    ///     let policy = Policy::builder(name, Algorithm::Gcra)
    ///         .limit(limit)
    ///         .window(Duration::from_secs(60))
    ///         .build()?;
    ///     Ok::<_, redlimit::ConfigError>(GuardedLimiter::builder(limiter.clone(), policy).build())
    /// };
    /// let free = per_minute("free", 10)?;
    /// let pro = per_minute("pro", 1_000)?;
    /// let layer = RateLimitLayer::new(free)
    ///     .key(HeaderKey::new("x-api-key")?)
    ///     .tiers([pro], |_, key: &str| key.starts_with("pro_").then_some(0));
    /// # Ok::<(), redlimit::ConfigError>(())
    /// ```
    pub fn tiers(
        mut self,
        tiers: impl IntoIterator<Item = GuardedLimiter>,
        choose: impl Fn(&Parts, &str) -> Option<usize> + Send + Sync + 'static,
    ) -> Self {
        self.tiers = tiers.into_iter().map(guarded).collect();
        self.choose = Some(Arc::new(choose));
        self
    }

    /// Retries counted once: a request carrying header `name` (such as `Idempotency-Key`) is
    /// checked [once](redlimit::CheckRequest::once) per value, so a retry within the
    /// [`idempotency_window`](Self::idempotency_window) gets the first decision and consumes
    /// nothing more. Requests without it are checked as usual. Works with
    /// [`count_when`](Self::count_when) and [`settle`](Self::settle): a retry is decided once
    /// and its first request settled once. Defaults to none.
    pub fn idempotency_key(mut self, name: HeaderName) -> Self {
        self.settings().idempotency = Some(name);
        self
    }

    /// How long [`idempotency_key`](Self::idempotency_key) remembers a request id's first
    /// decision: 1 ms to 24 hours. Defaults to the shortest window of the guard's policies.
    pub fn idempotency_window(mut self, window: Duration) -> Self {
        self.settings().once_window = Some(window);
        self
    }

    /// Counts only the requests whose response `counts` says so, such as failed logins: each
    /// check [reserves](redlimit::CheckRequest::reserve) its cost, and a response that does
    /// not count gives it back before it is sent (one more backend command, only for those
    /// responses). Concurrent requests cannot overrun the limit while their responses are
    /// pending, a settle never gives back more than its request took, and during a backend
    /// outage the failure policy answers and every request counts. Defaults to counting every
    /// request.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{Algorithm, GuardedLimiter, Limiter, MemoryBackend, Policy};
    /// use tower_redlimit::RateLimitLayer;
    ///
    /// let logins = Policy::builder("login", Algorithm::FixedWindow)
    ///     .limit(5)
    ///     .window(Duration::from_secs(900))
    ///     .build()?;
    /// let layer = RateLimitLayer::new(GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), logins).build())
    ///     .count_when(|status, _| status.is_client_error() || status.is_server_error());
    /// # Ok::<(), redlimit::ConfigError>(())
    /// ```
    pub fn count_when(
        self,
        counts: impl Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    ) -> Self {
        // Counted: the reservation stays as taken; not counted: none of it does.
        self.settle(move |served| (!counts(served.status, served.headers)).then_some(0))
    }

    /// Counts a cost known only from the response, such as tokens a model reports: each check
    /// reserves its request's [`cost`](Self::cost), and `actual` (from the response's status,
    /// headers and extensions: see [`Served`]) settles it before the response is sent: whatever the
    /// reservation took beyond the actual cost is given back, and an actual cost above the
    /// reservation is charged, even past the limit, so the client's next requests wait until
    /// the debt has refilled (see [`Limiter::settle`](redlimit::Limiter::settle)). `None`
    /// keeps the reservation as taken. Defaults to none.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{Algorithm, GuardedLimiter, Limiter, MemoryBackend, Policy};
    /// use tower_redlimit::RateLimitLayer;
    ///
    /// let tokens = Policy::builder("tokens", Algorithm::TokenBucket)
    ///     .limit(10_000)
    ///     .window(Duration::from_secs(60))
    ///     .build()?;
    /// let layer = RateLimitLayer::new(GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), tokens).build())
    ///     // An estimate of 500 tokens per request, settled by what the model reports.
    ///     .cost(|_| 500)
    ///     .settle(|served| served.headers.get("x-tokens-used")?.to_str().ok()?.parse().ok());
    /// # Ok::<(), redlimit::ConfigError>(())
    /// ```
    pub fn settle(
        mut self,
        actual: impl Fn(&Served<'_>) -> Option<u64> + Send + Sync + 'static,
    ) -> Self {
        self.settings().settle = Some(Arc::new(move |served, reserved| {
            actual(served).unwrap_or(reserved)
        }));
        self
    }

    /// Delay mode: the most requests of this layer that may wait for their slot at once (a
    /// semaphore); over it a request is answered 429 with `Retry-After`, its slot still
    /// counted. Their series: the gauge `redlimit_waiting` and the counter
    /// `redlimit_delay_rejected_total`, labelled by the guard's policy names. Defaults to
    /// 1,024.
    pub fn max_waiting(mut self, max: usize) -> Self {
        self.settings.waiters = Arc::new(Waiters::new(max, &self.guard.0));
        self
    }

    /// Delay mode: how many requests of this layer hold a place to wait now.
    pub fn waiting(&self) -> usize {
        self.settings.waiters.count()
    }

    /// What to do when the key extractor finds no key. Defaults to [`MissingKey::Refuse`]: 400
    /// when the client did not send it, 500 when the server did not provide it.
    pub fn missing_key(mut self, missing: MissingKey) -> Self {
        self.settings().missing_key = missing;
        self
    }

    /// The guarded limiter: its policies, counters and circuit breaker.
    pub fn guard(&self) -> &GuardedLimiter {
        &self.guard.0
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        let runtime = Runtime::new(
            &self.settings,
            &self.guard,
            &self.tiers,
            self.choose.clone(),
        );
        RateLimit::new(inner, Arc::new(runtime))
    }
}

/// `guard` with its HTTP series, registered with the recorder in force now.
fn guarded(guard: GuardedLimiter) -> Guarded {
    let series = Arc::new(HttpSeries::new(&guard));
    (guard, series)
}
