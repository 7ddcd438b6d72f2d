//! Limits by an API key's plan: keys starting `pro_` get 1,000 requests a minute, every other
//! key 10, each key counted on its own (`x-api-key`).

use std::time::Duration;

use axum::{Router, routing::get};
use redlimit::{Algorithm, ConfigError, GuardedLimiter, Limiter, MemoryBackend, Policy};
use tower_redlimit::{HeaderKey, RateLimitLayer};

fn app(limiter: &Limiter) -> Result<Router, ConfigError> {
    let per_minute = |name: &str, limit| {
        let policy = Policy::builder(name, Algorithm::Gcra)
            .limit(limit)
            .window(Duration::from_secs(60))
            .build()?;
        Ok::<_, ConfigError>(GuardedLimiter::builder(limiter.clone(), policy).build())
    };
    // Every plan's policies are validated here, once, never per request.
    let (free, pro) = (per_minute("free", 10)?, per_minute("pro", 1_000)?);
    let layer = RateLimitLayer::new(free)
        .key(HeaderKey::new("x-api-key")?)
        // Names the tier by its position in the list; `None` keeps the layer's own (free).
        .tiers([pro], |_, key: &str| key.starts_with("pro_").then_some(0));
    let hello = get(|| async { "hello\n" });
    Ok(Router::new().route("/", hello).route_layer(layer))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("try: curl -si -H 'x-api-key: pro_42' http://127.0.0.1:3000/");
    axum::serve(listener, app(&Limiter::new(MemoryBackend::default()))?).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::{body::Body, http::Request};
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn each_plan_has_its_own_limit_in_its_headers() {
        let app = app(&Limiter::new(MemoryBackend::default())).expect("an app");
        for (key, policy) in [
            ("free_1", "\"free\";q=10;w=60"),
            ("pro_1", "\"pro\";q=1000;w=60"),
        ] {
            let request = Request::get("/")
                .header("x-api-key", key)
                .body(Body::empty());
            let response = app.clone().oneshot(request.expect("a request")).await;
            let response = response.expect("infallible");
            assert_eq!(response.headers()["ratelimit-policy"], policy);
        }
    }
}
