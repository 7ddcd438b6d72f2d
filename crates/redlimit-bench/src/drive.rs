//! Runs N operations at concurrency C over K keys and times each one.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

/// Runs `n` calls of `op` (each given a key index below `keys`) from `concurrency` tasks, and
/// returns every call's latency in microseconds and the wall time.
pub(crate) async fn drive<F, Fut>(
    op: Arc<F>,
    n: usize,
    concurrency: usize,
    keys: usize,
    offset: usize,
) -> (Vec<u32>, Duration)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let per_task = n / concurrency;
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let op = Arc::clone(&op);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_task);
                for j in 0..per_task {
                    let key = (offset + task + j * concurrency) % keys;
                    let begun = Instant::now();
                    op(key).await;
                    latencies.push(u32::try_from(begun.elapsed().as_micros()).unwrap_or(u32::MAX));
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::with_capacity(n);
    for task in tasks {
        all.extend(task.await.expect("a benchmark task panicked"));
    }
    (all, started.elapsed())
}
