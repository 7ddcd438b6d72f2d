//! Counting only failed logins, by the user name in the JSON body: 5 wrong passwords per user
//! per 15 minutes lock that user out; right ones never count. A layer cannot read the body, so
//! the handler checks and answers as the layer would ([`Limited`]): each attempt reserves a
//! failure, and a right password gives it back.

use std::time::Duration;

use axum::{Json, Router, extract::State, http::StatusCode, response::IntoResponse, routing::post};
use redlimit::{Algorithm, ConfigError, GuardedLimiter, Limiter, MemoryBackend, Policy};
use tower_redlimit::Limited;

#[derive(serde::Deserialize)]
struct Login {
    user: String,
    password: String,
}

async fn login(State(guard): State<GuardedLimiter>, Json(login): Json<Login>) -> impl IntoResponse {
    let attempt = Limited::new(guard.policies(), guard.check(&login.user).reserve().await);
    if !attempt.allowed() {
        return attempt.into_response(); // 429, whatever the password
    }
    if login.password == "demo" {
        guard.settle(attempt.decisions(), 0).await; // not a failure: given back
        return StatusCode::OK.into_response();
    }
    (attempt, StatusCode::UNAUTHORIZED).into_response()
}

fn app(limiter: Limiter) -> Result<Router, ConfigError> {
    let failures = Policy::builder("login-failures", Algorithm::SlidingWindowLog)
        .limit(5)
        .window(Duration::from_secs(15 * 60))
        .build()?;
    let guard = GuardedLimiter::builder(limiter, failures).build();
    Ok(Router::new().route("/login", post(login)).with_state(guard))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!(
        "try: curl -si -H 'content-type: application/json' -d '{{\"user\":\"ann\",\"password\":\"x\"}}' 127.0.0.1:3000/login"
    );
    axum::serve(listener, app(Limiter::new(MemoryBackend::default()))?).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::{body::Body, http::Request};
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn successes_do_not_count_and_five_failures_lock_the_user_out() {
        let app = app(Limiter::new(MemoryBackend::default())).expect("an app");
        let attempt = async |user: &str, password: &str| {
            let body = format!("{{\"user\":\"{user}\",\"password\":\"{password}\"}}");
            let request = Request::post("/login").header("content-type", "application/json");
            let response = app
                .clone()
                .oneshot(request.body(Body::from(body)).expect("ok"));
            response.await.expect("infallible")
        };
        for _ in 0..5 {
            assert_eq!(attempt("ann", "demo").await.status(), StatusCode::OK);
        }
        for left in (0..5).rev() {
            let failed = attempt("ann", "guess").await;
            assert_eq!(failed.status(), StatusCode::UNAUTHORIZED);
            let state = failed.headers()["ratelimit"].to_str().expect("text");
            assert!(
                state.starts_with(&format!("\"login-failures\";r={left};")),
                "{state}"
            );
        }
        let locked = attempt("ann", "demo").await;
        assert_eq!(
            locked.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "the right password too"
        );
        assert!(locked.headers().contains_key("retry-after"));
        assert_eq!(
            attempt("bob", "demo").await.status(),
            StatusCode::OK,
            "another user"
        );
    }
}
