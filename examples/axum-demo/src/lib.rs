//! The redlimit demo: an axum app whose routes are limited as a TOML file says.
//!
//! `app` builds the router, so tests can drive it without a socket.

pub mod cli;
pub mod config;
mod metrics;

use axum::{Extension, Router, http::Uri, routing::get};
use redlimit::{Decision, GuardedLimiter, Limiter, MemoryBackend, RedisBackend};
use tower_redlimit::{AccessList, ClientIp, Global, HeaderKey, MissingKey, RateLimitLayer};

use self::config::{Handler, KeyKind, RedisUrl, Store};
pub use self::{
    config::{Config, ConfigFileError},
    metrics::{install_metrics, metrics_router},
};

/// The limiter the configuration asks for: Redis when `redis_url` is set, else memory.
///
/// # Errors
/// An unusable `redis_url`.
pub fn limiter(config: &Config) -> Result<Limiter, ConfigFileError> {
    let (builder, field) = match config.store()? {
        Store::Memory => return Ok(Limiter::new(MemoryBackend::default())),
        Store::Redis(url) => (RedisBackend::builder(url.expose()), "redis_url"),
        Store::Cluster(urls) => (
            RedisBackend::cluster(urls.iter().map(RedisUrl::expose)),
            "redis_cluster",
        ),
        Store::Sentinel { urls, master } => (
            RedisBackend::sentinel(urls.iter().map(RedisUrl::expose), master),
            "redis_sentinel",
        ),
    };
    let backend = builder
        .budget(config.budget)
        .build()
        .map_err(|e| ConfigFileError(format!("{field}: {e}")))?;
    Ok(Limiter::new(backend))
}

/// The router: every configured route answers `GET` with 200 and a short body, behind its
/// own limit. Other methods get 405 without consuming: the limit is a route layer, which the
/// method-not-allowed answer does not pass through.
///
/// # Errors
/// A message naming the field at fault.
pub fn app(config: &Config) -> Result<Router, ConfigFileError> {
    config.validate()?;
    let limiter = limiter(config)?;
    let client_ip = ClientIp::behind_proxies(&config.trusted_proxies)
        .map_err(|e| ConfigFileError(format!("trusted_proxies: {e}")))?
        .header(config.client_ip_header.clone());
    let mut router = Router::new();
    for route in &config.routes {
        let at = |e: &dyn std::fmt::Display| ConfigFileError(format!("route {}: {e}", route.path));
        let guard = GuardedLimiter::new(limiter.clone(), [route.policy()?])
            .map_err(|e| at(&e))?
            .failure(config.failure.policy())
            .budget(config.budget)
            .shadow(route.shadow);
        let mut layer = RateLimitLayer::new(guard).headers(config.headers);
        let list = |top: &[String], own: &[String]| {
            AccessList::new(top.iter().chain(own))
                .map(|list| list.client_ip(client_ip.clone()))
                .map_err(|e| at(&e))
        };
        if !config.allow.is_empty() || !route.allow.is_empty() {
            layer = layer.allow(list(&config.allow, &route.allow)?);
        }
        if !config.deny.is_empty() || !route.deny.is_empty() {
            layer = layer.deny(list(&config.deny, &route.deny)?);
        }
        if let Some(concurrency) = route.concurrency_policy()? {
            layer = layer.concurrency(concurrency);
        }
        let layer = match &route.key {
            KeyKind::Ip => layer.key(client_ip.clone()),
            KeyKind::Global => layer.key(Global),
            KeyKind::Header(name) => layer
                .key(HeaderKey::new(name).map_err(|e| at(&format!("key: {e}")))?)
                .missing_key(MissingKey::Shared("anonymous".to_owned())),
        };
        let handler = match route.handler {
            Handler::Hello => get(hello),
            Handler::Sleep(pause) => get(
                move |uri: Uri, decision: Option<Extension<Decision>>| async move {
                    tokio::time::sleep(pause).await;
                    hello(uri, decision).await
                },
            ),
        };
        router = router.route(&route.path, handler.route_layer(layer));
    }
    Ok(router)
}

/// A one-line description of the backend, for the start-up banner.
pub fn backend_description(config: &Config) -> String {
    let failure = &config.failure;
    match config.store() {
        Ok(Store::Redis(url)) => format!("redis at {url} (failure policy: {failure})"),
        Ok(Store::Cluster(urls)) => {
            format!(
                "redis cluster via {} (failure policy: {failure})",
                list(&urls)
            )
        }
        Ok(Store::Sentinel { urls, master }) => format!(
            "redis primary {master} via sentinels {} (failure policy: {failure})",
            list(&urls)
        ),
        Ok(Store::Memory) | Err(_) => "in-memory (no Redis configured)".to_owned(),
    }
}

/// URLs for a banner, credentials hidden.
fn list(urls: &[RedisUrl]) -> String {
    urls.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

async fn hello(uri: Uri, decision: Option<Extension<Decision>>) -> String {
    match decision {
        Some(Extension(d)) => format!(
            "ok {}: policy {}, {} remaining, decided by {}\n",
            uri.path(),
            d.policy,
            d.remaining,
            d.reason.as_str()
        ),
        None => format!("ok {}\n", uri.path()),
    }
}
