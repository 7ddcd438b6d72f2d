//! A [`tower`](https://docs.rs/tower) layer that rate-limits any axum, tonic or hyper service
//! with [redlimit](https://docs.rs/redlimit): Redis-backed, atomic, one round trip per request,
//! and an in-memory backend when there is no Redis.
//!
//! Build a [`GuardedLimiter`](redlimit::GuardedLimiter) (policies, a backend, what to do when
//! the backend fails), wrap it in a [`RateLimitLayer`], and say who is limited:
//!
//! ```
//! use std::{net::SocketAddr, time::Duration};
//! use axum::{Router, routing::get};
//! use redlimit::{Algorithm, FailurePolicy, GuardedLimiter, Limiter, MemoryBackend, Policy};
//! use tower_redlimit::{ClientIp, RateLimitLayer};
//!
//! fn app() -> Result<Router, redlimit::ConfigError> {
//!     // Or `RedisBackend::builder("redis://127.0.0.1:6379").build()?`.
//!     let limiter = Limiter::new(MemoryBackend::default());
//!     let per_minute = Policy::builder("per-minute", Algorithm::SlidingWindowCounter)
//!         .limit(60)
//!         .window(Duration::from_secs(60))
//!         .build()?;
//!     let guard = GuardedLimiter::builder(limiter, per_minute)
//!         .failure(FailurePolicy::local()) // defaults to Open
//!         .budget(Duration::from_millis(20)) // defaults to 50 ms
//!         .build();
//!     let layer = RateLimitLayer::new(guard)
//!         .key(ClientIp::behind_proxies(["10.0.0.0/8"])?); // defaults to the peer address
//!     // `route_layer`: matched routes only, so a wrong method's 405 consumes nothing (with
//!     // `Router::layer` or `get(handler).layer(..)` axum's 405 fallback is limited too).
//!     Ok(Router::new().route("/", get(|| async { "hello" })).route_layer(layer))
//! }
//! // Serve with `into_make_service_with_connect_info::<SocketAddr>()` so the peer is known.
//! # app().unwrap();
//! ```
//!
//! # What a request meets
//!
//! - **A key.** [`ClientIp::peer`] (axum's `ConnectInfo`, tonic's `TcpConnectInfo`),
//!   [`ClientIp::behind_proxies`] (the rightmost forwarded address that is not a trusted proxy,
//!   in the one header named by [`ClientIpHeader`]; never the leftmost, which the client writes), [`HeaderKey`] (API keys), [`MatchedRoute`]
//!   (feature `axum`), [`Global`], [`Both`], or any `Fn(&Parts) -> Option<String>`. A request
//!   without one follows [`MissingKey`].
//! - **Lists.** An [`AccessList`] to [`allow`](RateLimitLayer::allow) (unlimited) or
//!   [`deny`](RateLimitLayer::deny) (403) clients by network or key, before any check.
//! - **A check** of all the guard's policies in one round trip. The memory backend, a client the
//!   block cache knows is over its limit, and an open circuit decide at once, without a future;
//!   a check on Redis waits at most the guard's budget, then the failure policy answers.
//! - **An answer.** Allowed: the service is called with the
//!   [`Decisions`](redlimit::Decisions) (one per policy; the most restrictive by
//!   [`Decisions::most_restrictive`](redlimit::Decisions::most_restrictive)) in the request's
//!   extensions, and the response gets
//!   `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers) or the legacy
//!   `X-RateLimit-*` ([`HeaderStyle`]). Denied: `429 Too Many Requests` with `Retry-After`
//!   (`503` when the limiter failed closed), or gRPC's `RESOURCE_EXHAUSTED`, without calling
//!   the service; see [`RateLimitLayer::rejection`] and [`Rejected`]. The limiter adds its
//!   headers only where the response has none of its own. On a denial each denying policy's
//!   `t` is its own wait, so it matches `Retry-After`; an answer of the failure policy's open or
//!   closed mode carries no rate-limit headers, since no quota was checked.
//! - **Delay mode.** For a GCRA policy with
//!   [`max_delay`](redlimit::PolicyBuilder::max_delay), a request whose slot is reserved in
//!   the future waits for it (at most the guard's
//!   [`max_waiting`](RateLimitLayer::max_waiting) at once, else 429), then is
//!   served; a waiter whose client goes away is dropped at once.
//! - **Per request.** [`tiers`](RateLimitLayer::tiers) choose a guard by the request and its
//!   key (an API key's plan); [`idempotency_key`](RateLimitLayer::idempotency_key) counts a
//!   retried request once; [`count_when`](RateLimitLayer::count_when) and
//!   [`settle`](RateLimitLayer::settle) count by the response (failed logins only, or a cost the
//!   response reports), giving back a reservation before the response is sent.
//! - **Counts.** The layer counts what only the HTTP side sees, through the `metrics` facade
//!   with the recorder in force when it is given a guard: `redlimit_service_failures_total`
//!   (a `5xx` from the service after an allowed check), `redlimit_listed_total` (requests on
//!   a list), and in delay mode `redlimit_waiting` and `redlimit_delay_rejected_total`;
//!   beside the guard's decisions (see its metrics).
//!
//! Responses keep the service's own body type: any `Default` body works (axum's, tonic's,
//! `Full<Bytes>`, boxed bodies, tower-http's compression body), in front of a router or behind
//! it, and readiness is the service's.
//!
//! # Where it goes
//!
//! In front of an axum router (`layer.layer(router)`: every request, before routing, the
//! cheapest), `Router::layer` (every route and the fallback), `Router::route_layer` (matched
//! routes only; [`MatchedRoute`] keys need this, and a `405 Method Not Allowed` then consumes
//! nothing), one handler (`get(handler.layer(layer))`), or tonic's
//! `Server::builder().layer(layer)`.
//!
//! # Features
//!
//! - `axum`: client IPs from axum's `ConnectInfo`, [`MatchedRoute`] keys, and denials written
//!   into axum's body.
//! - `tonic`: client IPs from tonic's `TcpConnectInfo`.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc = include_str!("docs/layer.md")]
pub mod guide {}

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod access_list;
mod future;
mod headers;
mod http_metrics;
mod key;
mod layer;
mod lease_body;
mod limited;
mod missing_key;
mod rejection_body;
mod response;
mod runtime;
mod served;
mod service;
mod waiting_room;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use self::key::MatchedRoute;
pub use self::{
    access_list::AccessList,
    future::ResponseFuture,
    headers::HeaderStyle,
    key::{Both, ClientIp, ClientIpHeader, ExtensionKey, Global, HeaderKey, KeyExtractor},
    layer::RateLimitLayer,
    limited::Limited,
    missing_key::MissingKey,
    response::Rejected,
    served::Served,
    service::RateLimit,
};
