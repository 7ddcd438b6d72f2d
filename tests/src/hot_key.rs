//! One instance of a service on one hot key: what the `grants` tests run in several processes,
//! and the bench's `hot-key` mode too.

use redlimit::GuardedLimiter;

/// Makes `checks` checks of the client `global` through `guard`, `at_once` of them under way at
/// a time; how many were admitted and how many denied.
///
/// # Panics
/// On a check that failed (every check here must reach the backend), or a task that panicked.
pub async fn hammer_one_key(guard: &GuardedLimiter, checks: u64, at_once: u64) -> (u64, u64) {
    let at_once = at_once.max(1);
    let tasks: Vec<_> = (0..at_once)
        .map(|task| {
            let guard = guard.clone();
            // Each task's share of the checks, the first ones taking what does not divide.
            let share = checks / at_once + u64::from(task < checks % at_once);
            tokio::spawn(async move {
                let (mut admitted, mut denied) = (0, 0);
                for _ in 0..share {
                    let decisions = guard.check("global").await;
                    assert!(decisions.error().is_none(), "{:?}", decisions.error());
                    if decisions.allowed() {
                        admitted += 1;
                    } else {
                        denied += 1;
                    }
                }
                (admitted, denied)
            })
        })
        .collect();
    let mut totals = (0, 0);
    for task in tasks {
        let (admitted, denied) = task.await.expect("a task");
        totals = (totals.0 + admitted, totals.1 + denied);
    }
    totals
}
