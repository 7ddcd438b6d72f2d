//! Counting by response: a reservation is settled at its actual cost. Below it, given back (at
//! most what it took, only to the window it counted in); above it, charged now even past the
//! limit; correctly under concurrency; on Redis and in memory alike.

use std::{sync::Arc, time::Duration};

use axum::{
    Router,
    body::Body,
    http::{HeaderName, Request, StatusCode},
    routing::get,
};
use redlimit::{
    Algorithm, Decisions, FailurePolicy, GuardedLimiter, Limiter, Policy, PolicySet, Reason,
    RetryAfter, Timestamp,
};
use redlimit_tests::RedisServer;
use tower::ServiceExt;
use tower_redlimit::{HeaderKey, RateLimitLayer};

use crate::support::{T0, alone, at_ms, both_backends, policy, set_of};

async fn reserve(limiter: &Limiter, p: &[Policy], at: u64) -> Decisions {
    limiter
        .check(&set_of(p), "c")
        .reserve()
        .at(at_ms(at))
        .await
        .expect("reserve")
}

async fn refund(limiter: &Limiter, reserved: &Decisions, at: u64) -> bool {
    limiter
        .settle(reserved, 0)
        .at(at_ms(at))
        .await
        .expect("settle")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_gives_back_one_reservation_of_every_algorithm() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        for algorithm in Algorithm::ALL {
            let p = [policy(algorithm, 3, 60_000, None)];
            let name = format!("{backend} {}", algorithm.name());
            let mut taken = Vec::new();
            for i in 0..3 {
                let d = reserve(&limiter, &p, T0 + i).await;
                assert!(d.allowed(), "{name}: reservation {i}");
                assert_eq!(d.reserved_cost(), Some(1), "{name}");
                taken.push(d);
            }
            let denied = reserve(&limiter, &p, T0 + 3).await;
            assert!(!denied.allowed(), "{name}: the 4th is denied");
            assert_eq!(
                denied.reserved_cost(),
                None,
                "{name}: a denial took nothing"
            );
            assert!(
                !refund(&limiter, &denied, T0 + 4).await,
                "{name}: nothing to give back"
            );
            assert!(refund(&limiter, &taken[1], T0 + 5).await, "{name}");
            let after = reserve(&limiter, &p, T0 + 6).await;
            assert!(after.allowed(), "{name}: the refunded slot is free again");
            assert!(
                !reserve(&limiter, &p, T0 + 7).await.allowed(),
                "{name}: and only that one"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_that_ended_is_not_credited_to_the_next() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::FixedWindowAnchored,
            Algorithm::SlidingWindowCounter,
            Algorithm::SlidingWindowLog,
        ] {
            let p = [policy(algorithm, 2, 60_000, None)];
            let name = format!("{backend} {}", algorithm.name());
            let old = reserve(&limiter, &p, T0).await;
            assert!(old.allowed(), "{name}");
            // Two windows later the old reservation counts nowhere; the new window is full.
            let later = T0 + 120_000;
            for i in 0..2 {
                assert!(reserve(&limiter, &p, later + i).await.allowed(), "{name}");
            }
            assert!(
                !refund(&limiter, &old, later + 2).await,
                "{name}: the old window is gone"
            );
            assert!(
                !reserve(&limiter, &p, later + 3).await.allowed(),
                "{name}: the new window stays full"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_at_zero_gives_back_what_it_took() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        let p = [policy(Algorithm::FixedWindow, 10, 60_000, None)];
        let d = limiter
            .check(&set_of(&p), "c")
            .cost(2)
            .reserve()
            .at(at_ms(T0))
            .await
            .expect("reserve");
        assert_eq!(d.reserved_cost(), Some(2), "{backend}");
        limiter
            .settle(&d, 0)
            .at(at_ms(T0 + 1))
            .await
            .expect("settle");
        let peek = limiter
            .check(&alone(&p[0]), "c")
            .cost(0)
            .at(at_ms(T0 + 2))
            .await
            .expect("peek")[0]
            .clone();
        assert_eq!(peek.remaining, 10, "{backend}: the 2 it took");
        // A plain check is not refundable.
        let plain = limiter
            .check(&set_of(&p), "c")
            .at(at_ms(T0 + 3))
            .await
            .expect("check");
        assert_eq!(plain.reserved_cost(), None, "{backend}");
        assert!(
            !limiter.settle(&plain, 0).await.expect("settle"),
            "{backend}"
        );
        // A policy in delay mode cannot be reserved.
        let delayed = Policy::builder("delayed", Algorithm::Gcra)
            .limit(10)
            .window(Duration::from_secs(1))
            .max_delay(Duration::from_secs(1))
            .build()
            .expect("a policy");
        let error = limiter
            .check(
                &PolicySet::new([delayed].iter().cloned()).expect("a valid set"),
                "c",
            )
            .reserve()
            .await
            .expect_err("delay mode");
        assert!(
            error.to_string().contains("delay mode"),
            "{backend}: {error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_mixed_requests_count_exactly_their_failures() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        for limit in [3, 100] {
            let p: Arc<[Policy]> = Arc::new([policy(Algorithm::FixedWindow, limit, 60_000, None)]);
            let tasks: Vec<_> = (0..64)
                .map(|i| {
                    let (limiter, p) = (limiter.clone(), Arc::clone(&p));
                    tokio::spawn(async move {
                        let d = reserve(&limiter, &p, T0 + i).await;
                        let failed = i % 2 == 0;
                        if d.allowed() && !failed {
                            assert!(refund(&limiter, &d, T0 + i + 1).await);
                        }
                        d.allowed() && failed
                    })
                })
                .collect();
            let mut counted = 0;
            for task in tasks {
                counted += u64::from(task.await.expect("task"));
            }
            let peek = limiter
                .check(&alone(&p[0]), "c")
                .cost(0)
                .at(at_ms(T0 + 100))
                .await
                .expect("peek")[0]
                .clone();
            let count = limit - peek.remaining;
            assert_eq!(
                count, counted,
                "{backend} limit {limit}: the count is the failures"
            );
            assert!(counted <= limit.min(32), "{backend} limit {limit}");
            if limit == 100 {
                assert_eq!(counted, 32, "{backend}: every failure admitted and counted");
            }
            limiter.reset(&p[0], "c").await.expect("reset");
        }
    }
}

/// Three failed logins an hour, on `limiter` at T0: the policy and its app.
fn login_route(limiter: &Limiter) -> (Policy, Router) {
    let p = Policy::builder("login", Algorithm::FixedWindow)
        .limit(3)
        .window(Duration::from_secs(3_600))
        .build()
        .expect("a policy");
    let guard = GuardedLimiter::builder(limiter.clone(), p.clone())
        .budget(Duration::from_secs(5))
        .clock(Arc::new(|| Timestamp::from_millis(T0)))
        .build();
    (p, login_app(guard))
}

/// `/login` answers the status the request's `x-status` header names; retries of one
/// `idempotency-key` are counted once.
fn login_app(guard: GuardedLimiter) -> Router {
    let layer = RateLimitLayer::new(guard)
        .key(HeaderKey::new("x-key").expect("a header name"))
        .idempotency_key(HeaderName::from_static("idempotency-key"))
        .count_when(|status, _| status.as_u16() >= 400);
    let handler = |request: Request<Body>| async move {
        let status = request
            .headers()
            .get("x-status")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(200);
        StatusCode::from_u16(status).expect("a status")
    };
    Router::new().route("/login", get(handler)).layer(layer)
}

async fn login(app: &Router, status: u16) -> StatusCode {
    login_once(app, status, None).await
}

async fn login_once(app: &Router, status: u16, id: Option<&str>) -> StatusCode {
    login_response(app, status, id).await.status()
}

async fn login_response(app: &Router, status: u16, id: Option<&str>) -> axum::response::Response {
    let mut request = Request::get("/login")
        .header("x-key", "alice")
        .header("x-status", status.to_string());
    if let Some(id) = id {
        request = request.header("idempotency-key", id);
    }
    let request = request.body(Body::empty()).expect("a request");
    app.clone().oneshot(request).await.expect("infallible")
}

/// A response whose reservation was given back says what remains after the refund.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refunded_response_shows_what_remains_after_the_refund() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        let (_, app) = login_route(&limiter);
        let mut seen = Vec::new();
        for status in [200, 401, 200, 401, 200] {
            let response = login_response(&app, status, None).await;
            let state = response.headers()["ratelimit"].to_str().expect("ASCII");
            let remaining = state.split(';').find_map(|part| part.strip_prefix("r="));
            seen.push(remaining.expect("r").to_owned());
        }
        assert_eq!(seen, ["3", "2", "2", "1", "1"], "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_route_counts_only_failed_responses() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        let (p, app) = login_route(&limiter);
        for _ in 0..20 {
            assert_eq!(
                login(&app, 200).await,
                StatusCode::OK,
                "{backend}: 200s pass"
            );
        }
        for _ in 0..3 {
            assert_eq!(
                login(&app, 401).await,
                StatusCode::UNAUTHORIZED,
                "{backend}"
            );
        }
        assert_eq!(
            login(&app, 200).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{backend}: three failures used the limit"
        );
        let peek = limiter
            .check(&alone(&p), "alice")
            .cost(0)
            .at(at_ms(T0))
            .await
            .expect("peek")[0]
            .clone();
        assert_eq!(peek.remaining, 0, "{backend}");
    }
}

/// Request ids and counting by response together: a retry is decided once (it takes nothing)
/// and refunded once (its first request's refund gave back what was taken; the retry gives
/// back nothing more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_login_is_decided_once_and_refunded_once() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        let (p, app) = login_route(&limiter);
        let set = PolicySet::from(p);
        let remaining = || async {
            let peek = limiter.check(&set, "alice").cost(0).at(at_ms(T0)).await;
            peek.expect("peek")[0].remaining
        };
        // A failure counts, once however often it is retried.
        for _ in 0..3 {
            let status = login_once(&app, 401, Some("failed-1")).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{backend}");
        }
        assert_eq!(remaining().await, 2, "{backend}: one failure counted once");
        // A success is reserved, then refunded; its retries take nothing and give nothing.
        for _ in 0..3 {
            let status = login_once(&app, 200, Some("ok-1")).await;
            assert_eq!(status, StatusCode::OK, "{backend}");
        }
        assert_eq!(
            remaining().await,
            2,
            "{backend}: the retries of a success gave back none of the failure's count"
        );
        // Two more failures use the limit, and a fresh id is then denied.
        for id in ["failed-2", "failed-3"] {
            let status = login_once(&app, 401, Some(id)).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{backend}");
        }
        let denied = login_once(&app, 200, Some("ok-2")).await;
        assert_eq!(denied, StatusCode::TOO_MANY_REQUESTS, "{backend}");
        // The first id's retry still gets its first answer.
        let retried = login_once(&app, 200, Some("ok-1")).await;
        assert_eq!(retried, StatusCode::OK, "{backend}");
        assert_eq!(remaining().await, 0, "{backend}");
    }
}

/// During an outage, a local fallback reserves in its own limiter and the refund is given back
/// there: successful logins still do not count, and the failures still do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_reservation_is_refunded_to_the_fallback() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    drop(server);
    let p = Policy::builder("login", Algorithm::FixedWindow)
        .limit(3)
        .window(Duration::from_secs(3_600))
        .build()
        .expect("a policy");
    let guard = GuardedLimiter::builder(limiter, p)
        .failure(FailurePolicy::local())
        .budget(Duration::from_secs(5))
        .build();

    let reserved = guard.check("bob").reserve().await;
    assert_eq!(reserved.first().map(|d| d.reason), Some(Reason::Fallback));
    assert_eq!(
        reserved.reserved_cost(),
        Some(1),
        "the fallback's reservation"
    );
    assert!(
        guard.settle(&reserved, 0).await,
        "given back to the fallback"
    );
    assert_eq!(
        guard
            .check("bob")
            .reserve()
            .await
            .most_restrictive()
            .remaining,
        2
    );

    let app = login_app(guard);
    for _ in 0..20 {
        assert_eq!(login(&app, 200).await, StatusCode::OK, "200s pass");
    }
    for _ in 0..3 {
        assert_eq!(login(&app, 401).await, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(
        login(&app, 200).await,
        StatusCode::TOO_MANY_REQUESTS,
        "three failures used the fallback's limit"
    );
}

/// Reserves 100 of `p` for "c" at T0 and settles it at 250 at T0 + 1: the reservation.
async fn reserve_100_settle_250(limiter: &Limiter, p: &[Policy], name: &str) -> Decisions {
    let reserved = limiter
        .check(&set_of(p), "c")
        .cost(100)
        .reserve()
        .at(at_ms(T0))
        .await
        .expect("reserve");
    assert!(
        limiter
            .settle(&reserved, 250)
            .at(at_ms(T0 + 1))
            .await
            .expect("settle"),
        "{name}"
    );
    reserved
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_above_the_reservation_charges_the_difference() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        for algorithm in Algorithm::ALL {
            let name = format!("{backend} {}", algorithm.name());
            let p = [policy(algorithm, 1_000, 60_000, None)];
            let reserved = reserve_100_settle_250(&limiter, &p, &name).await;
            assert_eq!(reserved[0].remaining, 900, "{name}");
            let peek = limiter
                .check(&alone(&p[0]), "c")
                .cost(0)
                .at(at_ms(T0 + 2))
                .await
                .expect("peek");
            assert_eq!(peek[0].remaining, 750, "{name}: 250 taken");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_past_the_limit_makes_the_next_checks_wait_for_the_debt() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        for algorithm in Algorithm::ALL {
            let name = format!("{backend} {}", algorithm.name());
            let p = [policy(algorithm, 100, 60_000, None)];
            let reserved = reserve_100_settle_250(&limiter, &p, &name).await;
            assert!(reserved.allowed(), "{name}");
            let next = limiter
                .check(&alone(&p[0]), "c")
                .at(at_ms(T0 + 2))
                .await
                .expect("check");
            assert!(!next.allowed(), "{name}");
            let Some(RetryAfter::After(wait)) = next.retry_after() else {
                panic!("{name}: a wait");
            };
            let wait = u64::try_from(wait.as_millis()).expect("small");
            let least = match algorithm {
                // The debt of 150 and the request's 1 refill at 100 a minute.
                Algorithm::TokenBucket | Algorithm::Gcra => 151 * 600 - 2,
                // Until the window (the log: the charge's entries) ends.
                _ => 60_000 - 2,
            };
            assert!(wait >= least, "{name}: waits {wait} ms, at least {least}");
            let later = limiter
                .check(&alone(&p[0]), "c")
                .at(at_ms(T0 + 2 + wait))
                .await
                .expect("check");
            assert!(later.allowed(), "{name}: admitted once the debt refilled");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_settles_above_never_lose_a_charge() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        for algorithm in Algorithm::ALL {
            let name = format!("{backend} {}", algorithm.name());
            let p = Arc::new([policy(algorithm, 1_000, 3_600_000, None)]);
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..64 {
                let (limiter, p) = (limiter.clone(), Arc::clone(&p));
                tasks.spawn(async move {
                    let reserved = limiter
                        .check(&set_of(&p[..]), "c")
                        .reserve()
                        .at(at_ms(T0 + i))
                        .await
                        .expect("reserve");
                    limiter
                        .settle(&reserved, 3)
                        .at(at_ms(T0 + i))
                        .await
                        .expect("settle")
                });
            }
            let mut settled = 0;
            while let Some(changed) = tasks.join_next().await {
                settled += u32::from(changed.expect("task"));
            }
            assert_eq!(settled, 64, "{name}");
            let peek = limiter
                .check(&alone(&p[0]), "c")
                .cost(0)
                .at(at_ms(T0 + 100))
                .await
                .expect("peek");
            assert_eq!(
                peek[0].remaining,
                1_000 - 64 * 3,
                "{name}: every charge counted"
            );
        }
    }
}

/// A retry of a settled reservation (its request id sent again) is answered what is left after
/// the settle, not what the reservation left, whether the settle gave back or charged; on
/// Redis and in memory.
#[tokio::test]
async fn a_retry_of_a_settled_request_shows_the_settled_numbers() {
    let server = RedisServer::start();
    let p = alone(&policy(Algorithm::TokenBucket, 1_000, 3_600_000, None));
    for (name, limiter) in both_backends(&server) {
        for (id, actual) in [("gave-back", 30), ("charged", 150)] {
            let check = || {
                limiter
                    .check(&p, "c")
                    .cost(100)
                    .once(id, Duration::from_secs(60))
                    .reserve()
                    .at(at_ms(T0))
            };
            let reserved = check().await.expect("decided");
            assert!(reserved.allowed(), "{name}");
            let settle = limiter.settle(&reserved, actual).at(at_ms(T0 + 1));
            assert!(settle.await.expect("settled"), "{name}");
            let settled = reserved.clone().settled(actual);
            let retried = check().await.expect("decided");
            assert_eq!(
                retried[0].remaining, settled[0].remaining,
                "{name}, {id}: the retry shows the settled numbers, not {}",
                reserved[0].remaining
            );
            assert_eq!(
                retried.reserved_cost(),
                None,
                "{name}: a retry took nothing"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_refunds_the_state_in_force_never_past_what_it_holds_alike_on_both_backends() {
    use crate::support::{T0, alone, at_ms, both_backends, policy};

    let server = RedisServer::start();
    for algorithm in redlimit::Algorithm::ALL {
        let set = alone(&policy(algorithm, 10, 60_000, None));
        let mut seen = Vec::new();
        for (backend, limiter) in both_backends(&server) {
            let client = format!("give-back-{algorithm}");
            let mut quotas = Vec::new();
            // Takes 6, gives back 4, then 9 (more than it holds), takes 2; a window later,
            // gives back 3 of what is counted then.
            for (cost, give, at) in [
                (6, false, T0),
                (4, true, T0 + 1),
                (9, true, T0 + 2),
                (2, false, T0 + 3),
                (3, true, T0 + 60_001),
            ] {
                let check = limiter.check(&set, &client).cost(cost).at(at_ms(at));
                let check = if give { check.give_back() } else { check };
                let decisions = check
                    .await
                    .unwrap_or_else(|e| panic!("{backend} {algorithm}: {e}"));
                assert!(decisions.allowed(), "{backend} {algorithm}");
                quotas.push(decisions[0].remaining);
            }
            seen.push((backend, quotas));
        }
        assert_eq!(seen[0].1, seen[1].1, "{algorithm}: redis and memory alike");
        // After the refunds the whole limit is back: never past it.
        assert_eq!(seen[0].1[2], 10, "{algorithm}: {:?}", seen[0].1);
        assert!(
            seen[0].1[1] >= 8,
            "{algorithm}: 4 of 6 given back: {:?}",
            seen[0].1
        );
    }
}

/// A settle stopped by a later policy's corrupt state changes nothing, so that sent again once
/// the state is repaired it is made once: before, its earlier policies gave back at once
/// (a fixed window) or at the call's end (GCRA, the token bucket), and again when it was sent
/// again, handing back a second reservation's quota too. The later policy is a fixed window of
/// its own key, or GCRA in a key group.
#[tokio::test]
async fn a_settle_stopped_by_corrupt_state_is_made_once_when_sent_again() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    for (giver, last) in crate::support::before_a_later_policy() {
        let last = &last;
        let first = giver.algorithm();
        let set = set_of(&[giver.clone(), last.clone()]);
        let client = format!("c-{first}-{}", last.name());
        let first = format!("{first}, then {}", last.name());
        let mut reserved = Vec::new();
        for _ in 0..2 {
            let decisions = limiter
                .check(&set, &client)
                .cost(5)
                .reserve()
                .at(at_ms(T0))
                .await
                .expect("reserve");
            assert!(decisions.allowed(), "{first}");
            reserved.push(decisions);
        }
        let last_key = limiter.keys().key(last, &client);
        let _: () = deadpool_redis::redis::cmd("SET")
            .arg(&last_key)
            .arg("many")
            .query(&mut server.connection())
            .expect("SET");
        let left = async || {
            limiter
                .check(&alone(&giver), &client)
                .cost(0)
                .at(at_ms(T0 + 1))
                .await
                .expect("a check")[0]
                .remaining
        };
        let settled = limiter.settle(&reserved[0], 0).at(at_ms(T0 + 1)).await;
        assert!(settled.expect_err("corrupt").is_corrupt_state(), "{first}");
        assert_eq!(left().await, 0, "{first}: nothing given back");
        let _: () = deadpool_redis::redis::cmd("DEL")
            .arg(&last_key)
            .query(&mut server.connection())
            .expect("DEL");
        limiter
            .settle(&reserved[0], 0)
            .at(at_ms(T0 + 1))
            .await
            .expect("settled once repaired");
        assert_eq!(left().await, 5, "{first}: one reservation given back, once");
    }
}

/// A settle of a reservation made with a request id, whose id's key holds a value of another
/// type, is stopped before anything changes, and sent again once the key is repaired it gives
/// back once: before, it gave back and then failed at the id's key, and gave back again.
#[tokio::test]
async fn a_settle_stopped_by_its_request_ids_key_is_made_once_when_sent_again() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let set = alone(&policy(Algorithm::FixedWindow, 10, 60_000, None));
    let check = || limiter.check(&set, "c").cost(5).reserve().at(at_ms(T0));
    let with_id = check()
        .once("first", Duration::from_secs(60))
        .await
        .expect("reserve");
    let without = check().await.expect("reserve");
    assert!(with_id.allowed() && without.allowed());
    let mut redis = server.connection();
    let keys: Vec<String> = deadpool_redis::redis::cmd("KEYS")
        .arg("*~once*")
        .query(&mut redis)
        .expect("KEYS");
    let [id_key] = keys.as_slice() else {
        panic!("one request id's key: {keys:?}");
    };
    let _: () = deadpool_redis::redis::pipe()
        .cmd("DEL")
        .arg(id_key)
        .cmd("HSET")
        .arg(id_key)
        .arg("f")
        .arg("v")
        .query(&mut redis)
        .expect("a hash in its place");
    let left = async || {
        limiter
            .check(&set, "c")
            .cost(0)
            .at(at_ms(T0 + 1))
            .await
            .expect("a check")[0]
            .remaining
    };
    let settled = limiter.settle(&with_id, 0).at(at_ms(T0 + 1)).await;
    assert!(settled.is_err(), "the id's key is not a reply: {settled:?}");
    assert_eq!(left().await, 0, "nothing given back");
    let _: () = deadpool_redis::redis::cmd("DEL")
        .arg(id_key)
        .query(&mut redis)
        .expect("DEL");
    limiter
        .settle(&with_id, 0)
        .at(at_ms(T0 + 1))
        .await
        .expect("settled once repaired");
    assert_eq!(left().await, 5, "one reservation given back, once");
}
