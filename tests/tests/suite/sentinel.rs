//! The same limiter through Sentinel: a primary, a replica, 3 sentinels.

use std::time::Duration;

use redlimit::{Limiter, RedisBackend};
use redlimit_tests::RedisSentinel;

use crate::{
    failover::{assert_survived, checks_through_failover, guarded},
    vectors::exact_answers,
};

fn limiter(setup: &RedisSentinel) -> Limiter {
    let backend = RedisBackend::sentinel(setup.urls(), RedisSentinel::MASTER)
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid urls");
    Limiter::new(backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_vectors_and_several_policies_through_sentinel() {
    let setup = RedisSentinel::start();
    let limiter = limiter(&setup);
    exact_answers(&limiter, "sentinel").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_primary_is_replaced_and_no_check_hangs() {
    let setup = RedisSentinel::start();
    let guard = guarded(limiter(&setup));
    let (seen, setup) = checks_through_failover(guard, "hot", move || {
        let mut setup = setup;
        setup.kill_primary();
        setup.wait_for_failover();
        setup
    })
    .await;
    println!("sentinel failover: {seen:?}");
    assert_survived(&seen, "sentinel");
    drop(setup);
}
