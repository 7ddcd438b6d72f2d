use std::borrow::Cow;

use axum::extract::MatchedPath;
use http::request::Parts;

use super::KeyExtractor;

/// The axum route that matched, such as `/users/{id}`: one limit per route.
///
/// axum records the route only for middleware added with `Router::route_layer` or on a handler;
/// under `Router::layer` the request has not been routed yet and has no key.
///
/// ```
/// use axum::{Router, routing::get};
/// use redlimit::{Algorithm, GuardedLimiter, Limiter, MemoryBackend, Policy};
/// use tower_redlimit::{MatchedRoute, RateLimitLayer};
///
/// let policy = Policy::builder("per-route", Algorithm::Gcra)
///     .limit(1_000)
///     .window(std::time::Duration::from_secs(1))
///     .build()?;
/// let layer = RateLimitLayer::new(GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), policy).build())
///     .key(MatchedRoute);
/// let app: Router = Router::new()
///     .route("/users/{id}", get(|| async { "a user" }))
///     .route_layer(layer);
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct MatchedRoute;

impl KeyExtractor for MatchedRoute {
    /// Never the client's: the route is axum's to record.
    fn missing_by_client(&self, _: &Parts) -> bool {
        false
    }

    fn describe(&self) -> String {
        "axum's matched route (put the layer on with Router::route_layer)".to_owned()
    }

    fn extract<'a>(&self, request: &'a Parts) -> Option<Cow<'a, str>> {
        request
            .extensions
            .get::<MatchedPath>()
            .map(|path| Cow::Borrowed(path.as_str()))
    }
}
