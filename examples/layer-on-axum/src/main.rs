//! A rate limit on an axum app: 5 requests a minute per client IP, on Redis when `REDIS_URL` is
//! set, else in this process's memory.

use std::{net::SocketAddr, time::Duration};

use axum::{Router, routing::get};
use redlimit::{
    Algorithm, ConfigError, FailurePolicy, GuardedLimiter, Limiter, MemoryBackend, Policy,
    RedisBackend,
};
use tower_redlimit::RateLimitLayer;

fn limiter() -> Result<Limiter, ConfigError> {
    Ok(match std::env::var("REDIS_URL") {
        Ok(url) => Limiter::new(RedisBackend::builder(url).build()?),
        Err(_) => Limiter::new(MemoryBackend::default()),
    })
}

fn app(limiter: Limiter) -> Result<Router, ConfigError> {
    let per_minute = Policy::builder("per-minute", Algorithm::SlidingWindowCounter)
        .limit(5)
        .window(Duration::from_secs(60))
        .build()?;
    let guard = GuardedLimiter::builder(limiter, per_minute)
        .failure(FailurePolicy::local()) // Redis down: each instance limits on its own
        .build();
    // `route_layer`: only matched routes are limited, so a 404 or a wrong method's 405 costs
    // the client nothing (`Router::layer` would count them too).
    let hello = get(|| async { "hello\n" });
    Ok(Router::new()
        .route("/", hello)
        .route_layer(RateLimitLayer::new(guard)))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("try: for i in 1 2 3 4 5 6; do curl -si http://127.0.0.1:3000/ | head -1; done");
    // The default key is the peer address, which axum records with connect info.
    let app = app(limiter()?)?.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::{body::Body, extract::ConnectInfo, http::Request};
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn the_sixth_request_of_a_minute_is_turned_away() {
        let app = app(Limiter::new(MemoryBackend::default())).expect("an app");
        let peer = ConnectInfo(SocketAddr::from(([203, 0, 113, 7], 40_000)));
        let mut statuses = Vec::new();
        for _ in 0..6 {
            let mut request = Request::get("/").body(Body::empty()).expect("a request");
            request.extensions_mut().insert(peer);
            let response = app.clone().oneshot(request).await.expect("infallible");
            statuses.push(response.status().as_u16());
        }
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    }
}
