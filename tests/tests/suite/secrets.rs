//! No password in any log line, `Debug` or `Display`; a wrong password is logged, once.

use redlimit::PolicySet;
use std::time::Duration;

use deadpool_redis::redis;
use redlimit::{Algorithm, FailurePolicy, GuardedLimiter, Limiter, Reason, RedisBackend};
use redlimit_tests::{RedisServer, free_port};

use crate::support::{Captured, alone, policy};

const RIGHT: &str = "right-pass-7f3a";
const WRONG: &str = "wrong-pass-91c2";

/// Every log line written on this thread from now until the guard is dropped.
fn logged() -> (Captured, tracing::subscriber::DefaultGuard) {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

fn assert_secret_free(what: &str, text: &str) {
    for secret in [RIGHT, WRONG] {
        assert!(!text.contains(secret), "{what} shows a password: {text}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_wrong_password_is_logged_once_and_no_password_shows_anywhere() {
    let server = RedisServer::start_with(&["--requirepass", RIGHT]);
    let (logs, _logging) = logged();

    let url = format!("redis://:{WRONG}@127.0.0.1:{}", server.port());
    let builder = RedisBackend::builder(&url).budget(Duration::from_secs(5));
    assert_secret_free("the builder's Debug", &format!("{builder:?}"));
    let backend = builder.build().expect("a valid url");
    assert_secret_free("the backend's Debug", &format!("{backend:?}"));
    let guard = GuardedLimiter::builder(
        Limiter::new(backend),
        policy(Algorithm::FixedWindow, 5, 60_000, None),
    )
    .failure(FailurePolicy::Open)
    .budget(Duration::from_secs(5))
    .build();
    assert_secret_free("the guard's Debug", &format!("{guard:?}"));

    for _ in 0..3 {
        let decisions = guard.check("client").await;
        assert!(decisions.allowed(), "fail open answers");
        assert_eq!(decisions[0].reason, Reason::FailOpen);
        let error = decisions.error().expect("the backend's error comes along");
        assert!(
            error.to_string().contains("authentication failed"),
            "the error says what failed: {error}"
        );
        assert_secret_free("the error", &format!("{error} {error:?}"));
        assert_secret_free("the decisions", &format!("{decisions:?}"));
    }
    let log = logs.text();
    assert_secret_free("the log", &log);
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("authentication failed"))
        .collect();
    assert_eq!(lines.len(), 1, "one line for three failing checks: {log}");
    assert!(lines[0].contains("WARN"), "{log}");

    // A server that is not there: the connection error shows no password either.
    let nowhere = RedisBackend::builder(format!("redis://user:{WRONG}@127.0.0.1:{}", free_port()))
        .budget(Duration::from_secs(5))
        .build()
        .expect("a valid url");
    let err = Limiter::new(nowhere)
        .check(
            &PolicySet::from(policy(Algorithm::Gcra, 5, 60_000, None).clone()),
            "c",
        )
        .await
        .expect_err("nothing listens");
    assert_secret_free("a connection error", &format!("{err} {err:?}"));
    assert_secret_free("the log", &logs.text());
}

#[tokio::test]
async fn a_pool_the_application_built_carries_its_own_credentials() {
    let server = RedisServer::start_with(&["--requirepass", RIGHT]);
    let url = format!("redis://:{RIGHT}@127.0.0.1:{}", server.port());
    let pool = redlimit::deadpool_redis::Config::from_url(url)
        .create_pool(Some(redlimit::deadpool_redis::Runtime::Tokio1))
        .expect("a pool");
    let backend = RedisBackend::from_pool(pool)
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid");
    assert_secret_free("the backend's Debug", &format!("{backend:?}"));
    let p = policy(Algorithm::TokenBucket, 2, 60_000, None);
    let limiter = Limiter::new(backend);
    let allowed: Vec<bool> = {
        let mut allowed = Vec::new();
        for _ in 0..3 {
            let decision = limiter.check(&alone(&p), "c").await.expect("decided")[0].clone();
            assert_eq!(decision.reason, Reason::Redis);
            allowed.push(decision.allowed);
        }
        allowed
    };
    assert_eq!(allowed, [true, true, false]);
}

/// A guard on `url` with a log of its own: the WARN lines of three failing checks.
async fn warnings_of_three_failing_checks(url: String) -> Vec<String> {
    let (logs, _logging) = logged();
    let backend = RedisBackend::builder(url)
        .budget(Duration::from_secs(5))
        .build()
        .expect("a valid url");
    // Two policies: a call of more than ten arguments, which Redis refuses differently.
    let both = PolicySet::new([
        policy(Algorithm::FixedWindow, 5, 60_000, None),
        policy(Algorithm::Gcra, 5, 60_000, None),
    ])
    .expect("a valid set");
    let guard = GuardedLimiter::builder(Limiter::new(backend), both)
        .failure(FailurePolicy::Open)
        .budget(Duration::from_secs(5))
        .build();
    for _ in 0..3 {
        let decisions = guard.check("client").await;
        assert_eq!(decisions[0].reason, Reason::FailOpen);
    }
    let log = logs.text();
    assert_secret_free("the log", &log);
    log.lines()
        .filter(|line| line.contains("WARN"))
        .map(str::to_owned)
        .collect()
}

/// A refusal of the server's set-up is logged as what the operator must do: one WARN line for
/// three failing checks, naming authentication or the ACL.
#[tokio::test(flavor = "current_thread")]
async fn a_missing_password_a_wrong_one_and_an_acl_refusal_are_named() {
    let server = RedisServer::start_with(&["--requirepass", RIGHT]);
    let port = server.port();
    let mut admin = redis::Client::open(format!("redis://:{RIGHT}@127.0.0.1:{port}"))
        .and_then(|client| client.get_connection())
        .expect("the admin's connection");
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("limited")
        .arg("on")
        .arg(format!(">{RIGHT}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-@scripting")
        .query(&mut admin)
        .expect("ACL SETUSER");
    for (url, named) in [
        (
            format!("redis://127.0.0.1:{port}"),
            "authentication required",
        ),
        (
            format!("redis://:{WRONG}@127.0.0.1:{port}"),
            "authentication failed",
        ),
        (
            format!("redis://limited:{RIGHT}@127.0.0.1:{port}"),
            "ACL denied: the user may not run `evalsha`",
        ),
    ] {
        let warnings = warnings_of_three_failing_checks(url).await;
        assert_eq!(warnings.len(), 1, "{named}: one line: {warnings:?}");
        assert!(warnings[0].contains(named), "{named}: {warnings:?}");
        println!("{}", warnings[0]);
    }
}

/// A server that does not know `FCALL` answers with the call's first arguments, a client's key
/// among them: the checks go as scripts, and the log names the refusal, not the client.
#[tokio::test(flavor = "current_thread")]
async fn a_server_without_functions_is_logged_without_the_client() {
    let server = RedisServer::start_with(&["--rename-command", "FCALL", ""]);
    let (logs, _logging) = logged();
    let limiter = server.limiter();
    let p = policy(Algorithm::Gcra, 3, 60_000, None);
    let client = "key-of-a-client-4e9d";
    for remaining in [2, 1, 0] {
        let decision = limiter.check(&alone(&p), client).await.expect("check")[0].clone();
        assert_eq!(decision.remaining, remaining);
    }
    let log = logs.text();
    assert!(log.contains("checks go as scripts"), "{log}");
    assert!(!log.contains(client), "the log shows a client: {log}");
}
