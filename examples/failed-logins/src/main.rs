//! Counting only failed logins: 3 wrong passwords per user per 15 minutes, while right ones
//! never count. Each attempt reserves its slot, and a response under 400 gives it back.

use std::time::Duration;

use axum::{Router, http::HeaderMap, http::StatusCode, routing::post};
use redlimit::{Algorithm, ConfigError, GuardedLimiter, Limiter, MemoryBackend, Policy};
use tower_redlimit::{HeaderKey, RateLimitLayer};

async fn login(headers: HeaderMap) -> StatusCode {
    match headers.get("x-password").map(|v| v.as_bytes()) {
        Some(b"demo") => StatusCode::OK,
        _ => StatusCode::UNAUTHORIZED,
    }
}

fn app(limiter: Limiter) -> Result<Router, ConfigError> {
    let failures = Policy::builder("login-failures", Algorithm::SlidingWindowLog)
        .limit(3)
        .window(Duration::from_secs(15 * 60))
        .build()?;
    let layer = RateLimitLayer::new(GuardedLimiter::builder(limiter, failures).build())
        .key(HeaderKey::new("x-user")?)
        .count_when(|status, _| status.as_u16() >= 400);
    // On the handler: axum's 405 for a `GET /login` is then neither limited nor counted.
    Ok(Router::new().route("/login", post(login).route_layer(layer)))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("try: curl -si -X POST -H 'x-user: ann' -H 'x-password: guess' 127.0.0.1:3000/login");
    axum::serve(listener, app(Limiter::new(MemoryBackend::default()))?).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::{body::Body, http::Request};
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn successes_do_not_count_and_three_failures_lock_the_user_out() {
        let app = app(Limiter::new(MemoryBackend::default())).expect("an app");
        let attempt = |password: &'static str| {
            let request = Request::post("/login").header("x-user", "ann");
            let request = request.header("x-password", password).body(Body::empty());
            let app = app.clone();
            async move {
                app.oneshot(request.expect("a request"))
                    .await
                    .expect("ok")
                    .status()
            }
        };
        for _ in 0..5 {
            assert_eq!(attempt("demo").await, StatusCode::OK);
        }
        for _ in 0..3 {
            assert_eq!(attempt("guess").await, StatusCode::UNAUTHORIZED);
        }
        assert_eq!(attempt("demo").await, StatusCode::TOO_MANY_REQUESTS);
    }
}
