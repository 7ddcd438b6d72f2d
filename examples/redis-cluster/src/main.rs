//! redlimit on a Redis Cluster: every key of one client carries the client as its hash tag, so
//! all of a client's policies live in one slot and one script call checks them all. Give the
//! nodes in `REDIS_CLUSTER` (comma-separated `redis://host:port`).

use std::time::Duration;

use axum::{Router, routing::get};
use redlimit::{
    Algorithm, CircuitBreaker, FailurePolicy, GuardedLimiter, Limiter, Policy, PolicySet,
    RedisBackend,
};
use tower_redlimit::{HeaderKey, RateLimitLayer};

fn app(nodes: Vec<String>) -> Result<Router, redlimit::ConfigError> {
    let limiter = Limiter::new(RedisBackend::cluster(nodes).build()?);
    let per_second = Policy::builder("per-second", Algorithm::Gcra)
        .limit(10)
        .window(Duration::from_secs(1))
        .build()?;
    let per_day = Policy::builder("per-day", Algorithm::FixedWindow)
        .limit(10_000)
        .window(Duration::from_secs(86_400))
        .build()?;
    // Both in one call to the primary that owns the client's slot. A dead primary opens only
    // the circuit of its own range of slots: other clients keep their exact limits.
    let guard = GuardedLimiter::builder(limiter, PolicySet::new([per_second, per_day])?)
        .failure(FailurePolicy::local())
        .circuit_breaker(CircuitBreaker::new(5, Duration::from_secs(2)))
        .build();
    let layer = RateLimitLayer::new(guard).key(HeaderKey::new("x-api-key")?);
    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route_layer(layer))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = std::env::var("REDIS_CLUSTER").unwrap_or_else(|_| "redis://127.0.0.1:7000".into());
    let nodes = nodes.split(',').map(str::to_owned).collect();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("try: curl -si -H 'x-api-key: k1' http://127.0.0.1:3000/");
    axum::serve(listener, app(nodes)?).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::{body::Body, http::Request};
    use redlimit_tests::RedisCluster;
    use tower::ServiceExt;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn both_limits_are_checked_on_the_cluster() {
        let cluster = RedisCluster::start();
        let app = app(cluster.urls()).expect("an app");
        let request = Request::get("/")
            .header("x-api-key", "k1")
            .body(Body::empty());
        let response = app.oneshot(request.expect("a request")).await.expect("ok");
        assert_eq!(response.status(), 200);
        // The day's window is calendar-aligned: its `t` is what is left of today (UTC).
        let remaining = response.headers()["ratelimit"].to_str().expect("ascii");
        let expected = "\"per-second\";r=9;t=1, \"per-day\";r=9999;t=";
        assert!(remaining.starts_with(expected), "{remaining}");
    }
}
