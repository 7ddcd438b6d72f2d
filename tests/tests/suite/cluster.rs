//! The same limiter on a real Redis Cluster (3 primaries, 3 replicas).

use crate::support::set_of;
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use deadpool_redis::redis;
use redlimit::{Algorithm, Limiter, Reason, RedisBackend};
use redlimit_tests::RedisCluster;

use crate::{
    concurrency::exactly_the_limit,
    failover::{assert_survived, checks_through_failover, guarded},
    support::{T0, at_ms, policy},
    vectors::{TABLES, check_table, exact_answers},
};

fn limiter(cluster: &RedisCluster) -> Limiter {
    let backend = RedisBackend::cluster(cluster.urls())
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid urls");
    Limiter::new(backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_vectors_and_several_policies_on_the_cluster() {
    let cluster = RedisCluster::start();
    let limiter = limiter(&cluster);
    exact_answers(&limiter, "cluster").await;
    // Every node forgets the script and the state (a restart would too): EVAL answers
    // NOSCRIPT on each.
    for port in cluster.primaries() {
        let mut connection = cluster.connection(port);
        redlimit_tests::flush_all(&mut connection);
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut connection)
            .expect("SCRIPT FLUSH");
    }
    for table in TABLES {
        check_table(&limiter, "cluster after SCRIPT FLUSH", table).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_clients_spread_over_all_three_primaries() {
    let cluster = RedisCluster::start();
    let limiter = limiter(&cluster);
    // Windows of an hour: no key may expire before they are counted, however slow the machine
    // (a GCRA key lives one emission interval, here 6 minutes).
    let p = policy(Algorithm::FixedWindow, 10, 3_600_000, None);
    let both = [p, policy(Algorithm::Gcra, 10, 3_600_000, None)];
    for client in 0..10_000 {
        let d = limiter
            .check(&set_of(&both), &format!("client-{client}"))
            .at(at_ms(T0))
            .await
            .expect("no CROSSSLOT: both policies of a client share its slot");
        assert!(d.iter().all(|d| d.allowed));
    }
    let primaries = cluster.primaries();
    assert_eq!(primaries.len(), 3);
    let mut counts = Vec::new();
    for port in primaries {
        let keys: u64 = redis::cmd("DBSIZE")
            .query(&mut cluster.connection(port))
            .expect("DBSIZE");
        counts.push(keys);
    }
    println!("keys per primary: {counts:?}");
    assert_eq!(
        counts.iter().sum::<u64>(),
        20_000,
        "two keys per client: {counts:?}"
    );
    // An even spread is 6 667 each; hashing keeps every node near it.
    assert!(counts.iter().all(|&c| c > 5_000), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_limiters_on_the_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::start();
    exactly_the_limit(|| limiter(&cluster)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_primary_is_replaced_and_no_check_hangs() {
    let cluster = RedisCluster::start();
    let guard = guarded(limiter(&cluster));
    let key = guard.limiter().keys().key(&guard.policies()[0], "hot");
    let old = cluster.primary_of(&key).expect("a primary serves the key");
    // Clients whose keys live on the other primaries.
    let healthy: Vec<String> = (0..200)
        .map(|i| format!("healthy-{i}"))
        .filter(|client| {
            let key = guard.limiter().keys().key(&guard.policies()[0], client);
            cluster.primary_of(&key).is_some_and(|port| port != old)
        })
        .take(20)
        .collect();
    assert_eq!(healthy.len(), 20);
    let replacing = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let bystanders = {
        let (guard, replacing, done) = (guard.clone(), Arc::clone(&replacing), Arc::clone(&done));
        tokio::spawn(async move {
            let (mut redis, mut all) = (0_u64, 0_u64);
            while !done.load(Ordering::SeqCst) {
                for client in &healthy {
                    let during = replacing.load(Ordering::SeqCst);
                    let decided = guard.check(client).await;
                    if during && replacing.load(Ordering::SeqCst) {
                        all += 1;
                        redis += u64::from(decided[0].reason == Reason::Redis);
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (redis, all)
        })
    };
    let flag = Arc::clone(&replacing);
    let (seen, cluster) = checks_through_failover(guard, "hot", move || {
        let mut cluster = cluster;
        flag.store(true, Ordering::SeqCst);
        cluster.kill(old);
        let new = cluster.wait_for_new_primary(&key, old);
        flag.store(false, Ordering::SeqCst);
        assert_ne!(new, old);
        cluster
    })
    .await;
    done.store(true, Ordering::SeqCst);
    let (redis, all) = bystanders.await.expect("the bystanders' task");
    println!("cluster failover: {seen:?}");
    let share = redis as f64 / all.max(1) as f64;
    println!(
        "while the dead primary was replaced: {redis} of {all} checks for keys on the healthy \
         primaries decided by Redis ({:.1}%)",
        share * 100.0
    );
    assert_survived(&seen, "cluster");
    assert!(all > 0, "checks ran during the failover");
    assert!(share >= 0.9, "{redis} of {all} decided by Redis");
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_and_refunds_on_the_cluster() {
    let cluster = RedisCluster::start();
    let limiter = limiter(&cluster);
    let p = [redlimit::Policy::builder("api", Algorithm::FixedWindow)
        .limit(1)
        .window(Duration::from_secs(3_600))
        .overrides(true)
        .build()
        .expect("a policy")];
    for client in ["a", "b", "c", "d"] {
        limiter
            .set_override(
                &p[0],
                client,
                redlimit::Override::default().limit(3),
                Duration::from_secs(600),
            )
            .await
            .expect("set");
        let mut passed = 0;
        for i in 0..4 {
            let d = limiter
                .check(&set_of(&p), client)
                .at(at_ms(T0 + i))
                .await
                .expect("check");
            assert_eq!(d[0].limit, 3, "{client}");
            passed += u32::from(d.allowed());
        }
        assert_eq!(
            passed, 3,
            "{client}: the override's limit, its key in the client's slot"
        );
        let seen = limiter.inspect(&p[0], client).await.expect("inspect");
        assert_eq!(
            seen.decision.limit, 3,
            "{client}: inspected under the override"
        );
        assert!(
            limiter.reset(&p[0], client).await.expect("reset"),
            "{client}"
        );
    }
    let reserved = limiter
        .check(&set_of(&p), "e")
        .reserve()
        .at(at_ms(T0))
        .await
        .expect("reserve");
    assert!(limiter.settle(&reserved, 0).await.expect("settle"));
}

/// Healthy shards untouched: 32 tasks check 300 clients spread over the three primaries as
/// fast as they are answered while one primary is killed and its replica promoted. Of the
/// checks for clients on the two live primaries made in that window, Redis decides at least
/// 95% (the failure policy answers the rest). The nodes run with
/// `cluster-require-full-coverage no`, as the operations guide says: with Redis's default every
/// primary refuses every key (`CLUSTERDOWN`) from the moment the dead one is marked failed until
/// its replica is promoted, and no client can get a decision then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_primary_leaves_the_live_ones_deciding_under_load() {
    const TASKS: usize = 32;
    let cluster = RedisCluster::start_configured(&["--cluster-require-full-coverage", "no"]);
    let guard = guarded(limiter(&cluster));
    let key_of = |client: &str| guard.limiter().keys().key(&guard.policies()[0], client);
    let hot = key_of("hot");
    let dying = cluster.primary_of(&hot).expect("a primary");
    let clients: Arc<Vec<(String, bool)>> = Arc::new(
        (0..300)
            .map(|i| {
                let client = format!("client-{i}");
                let live = cluster.primary_of(&key_of(&client)) != Some(dying);
                (client, live)
            })
            .collect(),
    );
    assert!(clients.iter().filter(|(_, live)| *live).count() > 100);
    let window = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..TASKS)
        .map(|task| {
            let (guard, clients) = (guard.clone(), Arc::clone(&clients));
            let (window, done) = (Arc::clone(&window), Arc::clone(&done));
            tokio::spawn(async move {
                let (mut live, mut decided, mut all) = (0_u64, 0_u64, 0_u64);
                let mut next = task;
                let started = std::time::Instant::now();
                while !done.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(60) {
                    let (client, on_live) = &clients[next % clients.len()];
                    next += TASKS + 1;
                    let during = window.load(Ordering::SeqCst);
                    let decisions = guard.check(client).await;
                    all += 1;
                    if *on_live && during && window.load(Ordering::SeqCst) {
                        live += 1;
                        decided += u64::from(decisions[0].reason == Reason::Redis);
                    }
                }
                (live, decided, all)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let flag = Arc::clone(&window);
    let (took, cluster) = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        let started = std::time::Instant::now();
        flag.store(true, Ordering::SeqCst);
        cluster.kill(dying);
        cluster.wait_for_new_primary(&hot, dying);
        flag.store(false, Ordering::SeqCst);
        (started.elapsed(), cluster)
    })
    .await
    .expect("the failover");
    done.store(true, Ordering::SeqCst);
    let (mut live, mut decided, mut all) = (0, 0, 0);
    for task in load {
        let (l, d, a) = task.await.expect("a load task");
        (live, decided, all) = (live + l, decided + d, all + a);
    }
    let share = decided as f64 / live.max(1) as f64;
    println!(
        "a primary killed under load ({all} checks in all): its replica promoted after \
         {took:?}; meanwhile {decided} of {live} checks for clients on the live primaries were \
         decided by Redis: share {share:.3}"
    );
    assert!(live > 100, "load ran during the failover: {live}");
    assert!(share >= 0.95, "{decided} of {live} decided by Redis");
    drop(cluster);
}
