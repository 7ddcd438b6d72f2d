//! Envoy's global rate limit service on redlimit.
//!
//! [`RlsService`] serves `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` (the
//! protocol of Envoy's `ratelimit` filter, Istio's and Envoy Gateway's global limits) with
//! redlimit's engine: envoyproxy/ratelimit's YAML configuration loads unchanged ([`RlsConfig`]),
//! and each rule may also name a redlimit algorithm, a window of any length and a burst. A
//! request's descriptors are one check, a key per rule: if any is over its limit the request
//! is, and nothing is consumed. When Redis does not answer within the budget, the failure
//! policy answers (no stall).
//!
//! ```
//! use std::time::Duration;
//! use redlimit::{FailurePolicy, Limiter, MemoryBackend};
//! use redlimit_rls::{RlsConfig, RlsService};
//!
//! let yaml = "
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit:
//!       unit: minute
//!       requests_per_unit: 60
//!   - key: path
//!     value: /login
//!     rate_limit:
//!       algorithm: gcra      # redlimit's: any algorithm,
//!       window: 30s          # any window,
//!       requests_per_unit: 5
//!       burst: 2             # and a burst
//! ";
//! let config = RlsConfig::from_files([("edge.yaml", yaml)])?;
//! assert_eq!(config.rules(), 2);
//! let limiter = Limiter::new(MemoryBackend::default());
//! let service = RlsService::new(limiter, config, FailurePolicy::Open, Duration::from_millis(20));
//! // tonic::transport::Server::builder()
//! //     .add_service(RateLimitServiceServer::new(service))
//! # let _ = service;
//! # Ok::<(), redlimit_rls::ConfigError>(())
//! ```
//!
//! [`RlqsService`] serves RLQS (`StreamRateLimitQuotas`) on the same configuration and budgets.
//!
//! The `redlimit-rls` binary serves both: `redlimit-rls --config DIR [--redis URL]`; the
//! [guide] shows Envoy's side.

/// Envoy in front, redlimit behind: starting the service, Envoy's filter and actions, the
/// configuration's fields.
#[doc = include_str!("docs/guide.md")]
pub mod guide {}

mod config;
mod quota;
mod service;
mod watch;

pub use self::{
    config::{ConfigError, RlsConfig},
    quota::RlqsService,
    service::RlsService,
    watch::watch,
};
/// Envoy's protos, as this crate serves them.
pub use envoy_types;
