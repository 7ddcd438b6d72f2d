//! A flood: one client sends 90% of the traffic, far over its limit. With the local block cache
//! its denials cost no Redis command.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use redlimit::{Algorithm, BlockCache, GuardedLimiter};

use crate::{
    Settings,
    decisions::{admin, policy, redis_limiter},
    drive::interleaved,
    report::Row,
};

struct Flood {
    guard: GuardedLimiter,
    hot_allowed: AtomicU64,
    others_allowed: AtomicU64,
}

pub(crate) async fn run(url: &str, settings: &Settings) -> Vec<Row> {
    let mut admin = admin(url);
    let contenders: Vec<(&str, Arc<Flood>)> = [("flood_cache", true), ("flood_no_cache", false)]
        .into_iter()
        .map(|(name, cache)| {
            let guard = GuardedLimiter::builder(
                redis_limiter(url, name),
                policy(Algorithm::FixedWindow, 100),
            )
            .budget(std::time::Duration::from_secs(2))
            .block_cache(cache.then(BlockCache::default))
            .build();
            let flood = Flood {
                guard,
                hot_allowed: AtomicU64::new(0),
                others_allowed: AtomicU64::new(0),
            };
            (name, Arc::new(flood))
        })
        .collect();
    let clients: Arc<[String]> = (0..settings.keys).map(|k| format!("client-{k}")).collect();
    let tallies = interleaved(&contenders, settings, &mut admin, |(_, flood)| {
        let (flood, clients) = (Arc::clone(flood), Arc::clone(&clients));
        move |key: usize| {
            let (flood, clients) = (Arc::clone(&flood), Arc::clone(&clients));
            async move {
                // 9 in 10 requests come from the one hot client.
                let hot = !key.is_multiple_of(10);
                let client = if hot { "hot" } else { clients[key].as_str() };
                let allowed = flood.guard.check(client).await.allowed();
                let counter = if hot {
                    &flood.hot_allowed
                } else {
                    &flood.others_allowed
                };
                counter.fetch_add(u64::from(allowed), Ordering::Relaxed);
            }
        }
    })
    .await;
    contenders
        .iter()
        .zip(tallies)
        .map(|((name, flood), tally)| {
            let mut row = tally.row("flood", name, true, None);
            row.extra = vec![
                ("hot_allowed", flood.hot_allowed.load(Ordering::Relaxed)),
                (
                    "others_allowed",
                    flood.others_allowed.load(Ordering::Relaxed),
                ),
            ];
            row
        })
        .collect()
}
