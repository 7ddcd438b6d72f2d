//! The redlimit demo: an axum app whose routes are limited as a TOML file says.
//!
//! `app` builds the router, so tests can drive it without a socket.

pub mod config;
mod metrics;
mod reload;

use std::sync::Arc;

use axum::{
    Extension, Router,
    http::{HeaderMap, StatusCode, Uri},
    routing::{MethodFilter, MethodRouter, on},
};
use redlimit::{
    Decisions, GuardedLimiter, KeyScheme, Limiter, MemoryBackend, PolicySet, RedisBackend,
};
use tower_redlimit::{
    AccessList, ClientIp, Global, HeaderKey, KeyExtractor, MissingKey, RateLimitLayer,
};

use self::config::{Count, Handler, KeyKind, RedisUrl, Route, SERVED_METHODS, Store};
pub use self::{
    config::{Config, ConfigFileError},
    metrics::{install_metrics, metrics_router},
    reload::Reloadable,
};

/// The limiter the configuration asks for: Redis when `redis_url` is set, else memory.
///
/// # Errors
/// An unusable `redis_url`, an unreadable TLS file, a missing `hash_clients_secret_env`.
pub fn limiter(config: &Config) -> Result<Limiter, ConfigFileError> {
    let mut keys = match &config.key_prefix {
        Some(prefix) => {
            KeyScheme::new(prefix).map_err(|e| ConfigFileError(format!("key_prefix: {e}")))?
        }
        None => KeyScheme::default(),
    };
    if let Some(name) = &config.hash_clients_secret_env {
        let secret = std::env::var(name).ok().filter(|s| !s.is_empty());
        let secret = secret.ok_or_else(|| {
            ConfigFileError(format!(
                "hash_clients_secret_env: the environment variable {name} is not set or empty"
            ))
        })?;
        keys = keys.hash_clients(secret);
    }
    let (builder, field) = match config.store()? {
        Store::Memory => return Ok(Limiter::with_keys(MemoryBackend::default(), keys)),
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
    let mut builder = builder
        .budget(config.budget)
        .repair_corrupt_state(config.repair_corrupt_state);
    if let Some(path) = &config.tls_ca_file {
        builder = builder.tls_root_ca(read_pem("tls_ca_file", path)?);
    }
    if let (Some(cert), Some(key)) = (&config.tls_client_cert_file, &config.tls_client_key_file) {
        builder = builder.tls_client_certificate(
            read_pem("tls_client_cert_file", cert)?,
            read_pem("tls_client_key_file", key)?,
        );
    }
    let backend = builder
        .build()
        .map_err(|e| ConfigFileError(format!("{field}: {e}")))?;
    Ok(Limiter::with_keys(backend, keys))
}

/// The PEM file at `path`, named by its `field` when it cannot be read.
fn read_pem(field: &str, path: &std::path::Path) -> Result<Vec<u8>, ConfigFileError> {
    std::fs::read(path).map_err(|e| ConfigFileError(format!("{field}: {}: {e}", path.display())))
}

/// The router: every configured route answers `GET` with 200 and a short body, behind its
/// own limit. Other methods get 405 without consuming: the limit is a route layer, which the
/// method-not-allowed answer does not pass through.
///
/// # Errors
/// A message naming the field at fault.
pub fn app(config: &Config) -> Result<Router, ConfigFileError> {
    app_with(config, &limiter(config)?)
}

/// The router of `config` on `limiter`: on a reload that keeps the store, the same limiter, so
/// the memory backend's counters survive (Redis keeps its own).
///
/// # Errors
/// A message naming the field at fault.
pub fn app_with(config: &Config, limiter: &Limiter) -> Result<Router, ConfigFileError> {
    config.validate()?;
    let client_ip = ClientIp::behind_proxies(&config.trusted_proxies)
        .map_err(|e| ConfigFileError(format!("trusted_proxies: {e}")))?
        .header(config.client_ip_header.clone());
    let mut router = Router::new();
    for route in &config.routes {
        let at = |e: &dyn std::fmt::Display| ConfigFileError(format!("route {}: {e}", route.path));
        // Every guard of a route, its tiers' too, fails and waits alike.
        let guard = |policies: PolicySet| {
            GuardedLimiter::builder(limiter.clone(), policies)
                .failure(route.failure.unwrap_or(config.failure).policy())
                .budget(route.budget.unwrap_or(config.budget))
                .shadow(route.shadow)
                .build()
        };
        let mut layer =
            RateLimitLayer::new(guard(route.policies(route.policy()?)?)).headers(config.headers);
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
        if route.count == Count::Failures {
            layer = layer.count_when(|status, _| status.as_u16() >= 400);
        }
        if let Some(name) = &route.settle_header {
            let name = axum::http::HeaderName::try_from(name.as_str())
                .map_err(|e| at(&format!("settle_header: {e}")))?;
            layer =
                layer.settle(move |served| served.headers.get(&name)?.to_str().ok()?.parse().ok());
        }
        if let Some(name) = &route.idempotency_header {
            let name = axum::http::HeaderName::try_from(name.as_str())
                .map_err(|e| at(&format!("idempotency_header: {e}")))?;
            layer = layer.idempotency_key(name);
        }
        if let Some(window) = route.idempotency_window {
            layer = layer.idempotency_window(window);
        }
        if !route.limits.is_empty() {
            let names: Vec<String> = route.limits.keys().cloned().collect();
            let mut tiers = Vec::new();
            for tier in &names {
                tiers.push(guard(route.policies(route.tier_policy(tier)?)?));
            }
            layer = layer.tiers(tiers, tier_chooser(config, names)?);
        }
        let extractor = |key: &KeyKind, field: &str| -> Result<Arc<dyn KeyExtractor>, _> {
            Ok(match key {
                KeyKind::Ip => Arc::new(client_ip.clone()),
                KeyKind::Global => Arc::new(Global),
                KeyKind::Header(name) => {
                    Arc::new(HeaderKey::new(name).map_err(|e| at(&format!("{field}: {e}")))?)
                }
            })
        };
        let mut layer = layer.key(extractor(&route.key, "key")?);
        if let (KeyKind::Header(_), Some(shared)) = (&route.key, &route.anonymous) {
            layer = layer.missing_key(MissingKey::Shared(shared.clone()));
        }
        for also in &route.also {
            if let Some(key) = &also.key {
                let field = format!("also {}: key", also.name);
                let own = extractor(key, &field)?;
                layer = layer
                    .key_for(&also.name, own)
                    .map_err(|e| at(&format!("{field}: {e}")))?;
            }
        }
        router = router.route(&route.path, methods(route, &layer));
    }
    Ok(router)
}

/// Which of `names` a request's tier is: by the `tier_header` value when set, else by its key
/// among the `[[tier]]` keys.
fn tier_chooser(
    config: &Config,
    names: Vec<String>,
) -> Result<
    impl Fn(&axum::http::request::Parts, &str) -> Option<usize> + Send + Sync + 'static,
    ConfigFileError,
> {
    let header = config
        .tier_header
        .as_deref()
        .map(axum::http::HeaderName::try_from)
        .transpose()
        .map_err(|e| ConfigFileError(format!("tier_header: {e}")))?;
    let by_key: std::collections::HashMap<String, usize> = config
        .tiers
        .iter()
        .filter_map(|tier| Some((names.iter().position(|n| *n == tier.name)?, &tier.keys)))
        .flat_map(|(at, keys)| keys.iter().map(move |key| (key.clone(), at)))
        .collect();
    Ok(
        move |request: &axum::http::request::Parts, key: &str| match &header {
            Some(header) => {
                let named = request.headers.get(header)?.to_str().ok()?;
                names.iter().position(|n| n == named)
            }
            None => by_key.get(key).copied(),
        },
    )
}

/// The route's handler for each method it serves, limited by `layer` for the methods it
/// limits: GET alone by default, or those `methods` names among every served one.
fn methods(route: &Route, layer: &RateLimitLayer) -> MethodRouter {
    let served: &[&str] = if route.methods.is_empty() {
        &["GET"]
    } else {
        &SERVED_METHODS
    };
    let mut router = MethodRouter::new();
    for method in served {
        let filter = match *method {
            "POST" => MethodFilter::POST,
            "PUT" => MethodFilter::PUT,
            "PATCH" => MethodFilter::PATCH,
            "DELETE" => MethodFilter::DELETE,
            _ => MethodFilter::GET,
        };
        let handler = handler(route.handler, filter);
        let limited = route.methods.is_empty()
            || route.methods.iter().any(|m| m.eq_ignore_ascii_case(method));
        router = router.merge(if limited {
            handler.route_layer(layer.clone())
        } else {
            handler
        });
    }
    router
}

/// What the route answers, for requests of `filter`'s method.
fn handler(handler: Handler, filter: MethodFilter) -> MethodRouter {
    match handler {
        Handler::Hello => on(filter, hello),
        Handler::Sleep(pause) => on(
            filter,
            move |uri: Uri, decisions: Option<Extension<Decisions>>| async move {
                tokio::time::sleep(pause).await;
                hello(uri, decisions).await
            },
        ),
        Handler::Status(code) => on(filter, move || async move {
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        }),
        Handler::Metered => on(filter, |uri: Uri| async move {
            let cost = uri
                .query()
                .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("cost=")))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(1);
            ([("x-cost", cost.to_string())], "metered\n")
        }),
        Handler::Login => on(filter, |headers: HeaderMap| async move {
            if headers.get("x-password").is_some_and(|p| p == "demo") {
                StatusCode::OK
            } else {
                StatusCode::UNAUTHORIZED
            }
        }),
    }
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

async fn hello(uri: Uri, decisions: Option<Extension<Decisions>>) -> String {
    match decisions {
        Some(Extension(decisions)) => {
            let d = decisions.most_restrictive();
            format!(
                "ok {}: policy {}, {} remaining, decided by {}\n",
                uri.path(),
                d.policy,
                d.remaining,
                d.reason.as_str()
            )
        }
        None => format!("ok {}\n", uri.path()),
    }
}
