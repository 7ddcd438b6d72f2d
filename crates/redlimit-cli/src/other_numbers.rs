//! A hint for a policy named on the command line whose algorithm and window match no state:
//! the ones its name's keys do have. (A limit or burst names no key: state is read under any.)

use redlimit_core::{Limiter, Policy, deadpool_redis::redis};

/// At most this many `SCAN` calls (of 1,000 keys each) look for keys of another window.
const SCAN_CALLS: usize = 100;

/// A warning line naming up to 5 key suffixes (algorithm and window) under which keys of
/// `policy`'s name exist on the standalone Redis at `url`, when there are any; `None` when
/// there are none, or Redis cannot say.
pub(super) async fn warning(url: &str, limiter: &Limiter, policy: &Policy) -> Option<String> {
    // prefix:name:{client}:suffix, as the library names keys.
    let key = limiter.keys().key(policy, "x");
    let (head, suffix) = key.split_once(":{x}:")?;
    let pattern = format!("{head}:{{*}}:*");
    let client = redis::Client::open(url).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let mut cursor = 0_u64;
    let mut others: Vec<String> = Vec::new();
    for _ in 0..SCAN_CALLS {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1_000)
            .query_async(&mut conn)
            .await
            .ok()?;
        for key in keys {
            // Another algorithm or window, not an override's or a ban's key (`~`).
            let other = key.rsplit_once("}:").map(|(_, s)| s.to_owned());
            if let Some(other) = other.filter(|o| o != suffix && !o.starts_with('~'))
                && !others.contains(&other)
                && others.len() < 5
            {
                others.push(other);
            }
        }
        cursor = next;
        if cursor == 0 || others.len() == 5 {
            break;
        }
    }
    (!others.is_empty()).then(|| {
        format!(
            "warning: no state of {} under this algorithm and window ({suffix}); its keys have: {}\n",
            policy.name(),
            others.join(", ")
        )
    })
}
