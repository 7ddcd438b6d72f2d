//! A `tower::Layer` that rate-limits any axum or tonic service with
//! [redlimit](https://docs.rs/redlimit): Redis-backed, atomic, one round trip per request.
//!
//! ```
//! use std::{net::SocketAddr, time::Duration};
//! use axum::{Router, routing::get};
//! use redlimit::{Algorithm, FailurePolicy, Limiter, MemoryBackend, Policy};
//! use tower_redlimit::{ClientIp, RateLimitLayer};
//!
//! # fn app() -> Result<Router, redlimit::ConfigError> {
//! let limiter = Limiter::new(MemoryBackend::default()); // or a RedisBackend
//! let per_minute = Policy::builder("per-minute", Algorithm::SlidingWindowCounter)
//!     .limit(60)
//!     .window(Duration::from_secs(60))
//!     .build()?;
//! let layer = RateLimitLayer::new(limiter, [per_minute])?
//!     .key(ClientIp::behind_proxies(["10.0.0.0/8"])?)
//!     .failure(FailurePolicy::local());
//! Ok(Router::new().route("/", get(|| async { "hello" })).layer(layer))
//! # }
//! // Serve with `into_make_service_with_connect_info::<SocketAddr>()` so the peer is known.
//! # app().unwrap();
//! ```
//!
//! Features: `axum` (client IPs from `ConnectInfo`, [`MatchedRoute`] keys), `tonic` (client IPs
//! from `TcpConnectInfo`).

mod body;
mod future;
mod headers;
mod key;
mod layer;
mod response;
mod runtime;
mod service;

#[cfg(feature = "axum")]
pub use self::key::MatchedRoute;
pub use self::{
    body::ResponseBody,
    future::ResponseFuture,
    headers::HeaderStyle,
    key::{Both, ClientIp, Global, HeaderKey, KeyExtractor},
    layer::{MissingKey, RateLimitLayer},
    response::Rejected,
    service::RateLimit,
};
