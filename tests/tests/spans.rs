//! The check spans, in a binary of their own: a subscriber set for one thread sees every
//! callsite only when no other test registers them at the same time.

#[allow(dead_code, unreachable_pub)]
#[path = "suite/support.rs"]
mod support;

use redlimit::{Algorithm, GuardedLimiter};
use redlimit_tests::RedisServer;

use crate::support::{Captured, keyed_app, policy, send};

#[tokio::test(flavor = "current_thread")]
async fn one_check_span_per_request_with_its_fields_and_no_client_key() {
    const SECRET_KEY: &str = "sk_live_4f9a7c2e";
    let server = RedisServer::start();
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .finish();
    let _tracing = tracing::subscriber::set_default(subscriber);
    let guard =
        GuardedLimiter::builder(server.limiter(), policy(Algorithm::Gcra, 2, 60_000, None)).build();
    let app = keyed_app(guard);
    let statuses = [
        send(&app, "/", SECRET_KEY).await,
        send(&app, "/", SECRET_KEY).await,
        send(&app, "/", SECRET_KEY).await,
        send(&app, "/", "other").await,
    ];
    assert_eq!(statuses, [200, 200, 429, 200]);

    let text = logs.text();
    let closed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("redlimit.check{") && l.contains(": redlimit: close"))
        .collect();
    assert_eq!(closed.len(), 4, "one span per request: {text}");
    for line in &closed {
        for field in ["policies=gcra", "cost=1", "client=", "reason=", "allowed="] {
            assert!(line.contains(field), "{field} in {line}");
        }
    }
    assert!(closed[0].contains("allowed=true") && closed[0].contains("reason=\"redis\""));
    assert!(closed[2].contains("allowed=false"), "{}", closed[2]);
    let tag = |line: &str| {
        let at = line.find("client=").expect("a client field") + "client=".len();
        line[at..at + 8].to_owned()
    };
    assert_eq!(
        tag(closed[0]),
        tag(closed[2]),
        "the same client, the same tag"
    );
    assert_ne!(
        tag(closed[0]),
        tag(closed[3]),
        "another client, another tag"
    );
    let denials: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("DEBUG") && l.contains("rate limit exceeded"))
        .collect();
    assert_eq!(denials.len(), 1, "one event per denial: {text}");
    assert!(
        !text.contains(SECRET_KEY),
        "the raw client key shows: {text}"
    );
}
