//! Operators' resets and overrides reach every instance at once: each instance's backend hears
//! the event on a connection of its own and stops using its local blocks; while it cannot hear,
//! a block lasts at most 1 s.

use std::time::{Duration, Instant};

use redlimit::{
    Algorithm, Backend, GuardedLimiter, Limiter, Override, Policy, Reason, RedisBackend,
};
use redlimit_tests::{RedisCluster, RedisServer, free_port};

/// A budget of seconds for what the test waits for, which takes milliseconds.
const PATIENCE: Duration = Duration::from_secs(10);

fn api() -> Policy {
    Policy::builder("api", Algorithm::FixedWindow)
        .limit(2)
        .window(Duration::from_secs(3_600))
        .overrides(true)
        .build()
        .expect("a policy")
}

/// An instance: a guard with the default block cache, on a backend of its own.
fn instance(backend: RedisBackend) -> GuardedLimiter {
    GuardedLimiter::builder(Limiter::new(backend), api())
        .budget(Duration::from_secs(5))
        .build()
}

fn listening(guard: &GuardedLimiter) -> bool {
    match guard.limiter().backend() {
        Backend::Redis(redis) => redis.is_listening(),
        _ => unreachable!("on Redis"),
    }
}

/// Waits (within [`PATIENCE`]) until `done`, returning how long it took.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < PATIENCE, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

/// Blocks `client` at every instance: over its limit, its denials then served locally.
async fn block_everywhere(instances: &[GuardedLimiter], client: &str) {
    for guard in instances {
        until("listening", async || listening(guard)).await;
        until("blocked locally", async || {
            guard.check(client).await[0].reason == Reason::LocalBlock
        })
        .await;
    }
}

/// How long until every instance's next check of `client` is decided by Redis and allowed.
async fn lifted_everywhere(instances: &[GuardedLimiter], client: &str, what: &str) {
    for (i, guard) in instances.iter().enumerate() {
        let took = until(what, async || {
            let d = guard.check(client).await;
            d.allowed() && d[0].reason == Reason::Redis
        })
        .await;
        println!("{what}: instance {i} decided by Redis after {took:?}");
    }
}

async fn operators_actions_lift_blocks(instances: &[GuardedLimiter], operator: &Limiter) {
    let policy = api();
    block_everywhere(instances, "k1").await;
    assert!(operator.reset(&policy, "k1").await.expect("reset"));
    lifted_everywhere(instances, "k1", "after a reset").await;

    block_everywhere(instances, "k2").await;
    operator
        .set_override(&policy, "k2", Override::default().limit(10), PATIENCE)
        .await
        .expect("set");
    lifted_everywhere(instances, "k2", "after an override raised the limit").await;

    // Over the override's 10 too, then cleared, then reset: the policy's 2 again.
    block_everywhere(instances, "k2").await;
    assert!(operator.clear_override(&policy, "k2").await.expect("clear"));
    assert!(operator.reset(&policy, "k2").await.expect("reset"));
    lifted_everywhere(instances, "k2", "after clear-override and a reset").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_and_overrides_lift_local_blocks_at_every_instance() {
    let server = RedisServer::start();
    let backend = || {
        RedisBackend::builder(server.url())
            .budget(Duration::from_secs(5))
            .build()
            .expect("valid")
    };
    let instances = [instance(backend()), instance(backend())];
    operators_actions_lift_blocks(&instances, &server.limiter()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_and_overrides_lift_local_blocks_on_a_cluster() {
    let cluster = RedisCluster::start();
    let backend = || {
        RedisBackend::cluster(cluster.urls())
            .budget(Duration::from_secs(5))
            .build()
            .expect("valid")
    };
    let instances = [instance(backend()), instance(backend())];
    operators_actions_lift_blocks(&instances, &Limiter::new(backend())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_listens_again_after_a_restart_and_a_reset_it_missed_lifts_blocks() {
    let port = free_port();
    let mut server = RedisServer::start_on_port(port);
    let guard = instance(
        RedisBackend::builder(server.url())
            .budget(Duration::from_secs(5))
            .build()
            .expect("valid"),
    );
    block_everywhere(std::slice::from_ref(&guard), "k1").await;
    server.kill();
    until("deaf while Redis is down", async || !listening(&guard)).await;
    let server = RedisServer::start_on_port(port);
    until("listening again", async || listening(&guard)).await;

    // A reset the listener cannot hear: its subscription killed, the reset made at once.
    block_everywhere(std::slice::from_ref(&guard), "k2").await;
    let mut connection = server.connection();
    let killed: u64 = redlimit::deadpool_redis::redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut connection)
        .expect("CLIENT KILL");
    assert_eq!(killed, 1, "the listener's one connection");
    assert!(server.limiter().reset(&api(), "k2").await.expect("reset"));
    lifted_everywhere(std::slice::from_ref(&guard), "k2", "after a missed reset").await;
    until("listening again", async || listening(&guard)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_from_the_applications_pool_cannot_listen_and_keeps_blocks_a_second() {
    let server = RedisServer::start();
    let pool = redlimit::deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(redlimit::deadpool_redis::Runtime::Tokio1))
        .expect("a pool");
    let guard = instance(
        RedisBackend::from_pool(pool)
            .budget(Duration::from_secs(5))
            .build()
            .expect("valid"),
    );
    for _ in 0..3 {
        guard.check("k1").await;
    }
    let blocked = guard.check("k1").await;
    assert_eq!(blocked[0].reason, Reason::LocalBlock, "blocked locally");
    assert!(!listening(&guard));
    assert!(server.limiter().reset(&api(), "k1").await.expect("reset"));
    let took = until("the block's second is over", async || {
        guard.check("k1").await.allowed()
    })
    .await;
    println!("unheard reset took effect after {took:?}");
}

/// A flood that starts with the service: a client already over its limit is checked at once
/// after `build()`, and again right after. The first goes to Redis, the rest are answered by
/// the local block, before and after the listener first subscribes (which drops nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_recorded_at_start_is_kept_when_the_listener_first_subscribes() {
    let server = RedisServer::start();
    let elsewhere = server.limiter();
    for _ in 0..2 {
        assert!(
            elsewhere
                .check(&redlimit::PolicySet::from(api()), "k1")
                .await
                .expect("redis")
                .allowed()
        );
    }
    let mut stats = server.connection();
    let guard = instance(server.backend());
    let before = redlimit_tests::script_calls(&mut stats).commands;
    let first = guard.check("k1").await;
    assert_eq!(first[0].reason, Reason::Redis);
    assert!(!first.allowed());
    let second = guard.check("k1").await;
    assert_eq!(
        second[0].reason,
        Reason::LocalBlock,
        "at once after the first"
    );
    until("listening", async || listening(&guard)).await;
    let third = guard.check("k1").await;
    assert_eq!(
        third[0].reason,
        Reason::LocalBlock,
        "kept by the first subscription"
    );
    assert_eq!(
        redlimit_tests::script_calls(&mut stats).commands - before,
        1,
        "one script call: the first check's"
    );
}
