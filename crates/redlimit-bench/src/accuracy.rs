//! `--mode accuracy`: the same traffic through every algorithm at explicit times, and what each
//! admits per sliding window, against the exact sliding log. Drawn as one SVG, summed up as a
//! table.
//!
//! One client, limit 10 per 10 s, on a timeline of three phases with idle gaps between them
//! (long enough for every algorithm to forget): steady traffic at twice the limit, a burst
//! straddling a window edge (the limit just before it and again just after), and a mix of
//! on/off bursts from a fixed pseudo-random sequence. Decided by the memory backend, whose
//! arithmetic is the scripts' (a property test holds the two to identical decisions).

use redlimit::PolicySet;
use std::{ops::Range, time::Duration};

use redlimit::{Algorithm, Limiter, MemoryBackend, Policy, Timestamp};

/// Requests per window.
pub(crate) const LIMIT: u64 = 10;
/// The window, in milliseconds.
pub(crate) const WINDOW_MS: u64 = 10_000;
/// The timeline's start: a multiple of the window, so aligned windows start at whole tens.
const T0_MS: u64 = 1_700_000_000_000;
/// Where the curves are sampled.
const STEP_MS: u64 = 100;

/// A phase of the timeline, in milliseconds from its start.
#[derive(Debug, Clone)]
pub(crate) struct Phase {
    pub(crate) name: &'static str,
    pub(crate) span: Range<u64>,
}

/// The phases and the request times, ascending, in milliseconds from the start.
pub(crate) fn traffic() -> (Vec<Phase>, Vec<u64>) {
    let mut times = Vec::new();
    // Steady at twice the limit: one request every 500 ms for 40 s.
    times.extend((0..80).map(|i| i * 500));
    // The limit at 69.9 s, just before the edge at 70 s, and again at 70.0 s.
    times.extend(std::iter::repeat_n(69_900, 10));
    times.extend(std::iter::repeat_n(70_000, 10));
    // On/off bursts for 60 s from 100 s: each 100 ms tick sends 0 to 3 requests by a fixed
    // linear congruential sequence, with quiet seconds between busy ones.
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    for tick in 0..600_u64 {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let busy = (tick / 10) % 3 != 2;
        let count = if busy { (state >> 62) as usize } else { 0 };
        times.extend(std::iter::repeat_n(100_000 + tick * STEP_MS, count));
    }
    let phases = vec![
        Phase {
            name: "steady at 2x the limit",
            span: 0..50_000,
        },
        Phase {
            name: "burst straddling a window edge",
            span: 60_000..80_000,
        },
        Phase {
            name: "on/off bursts",
            span: 100_000..170_000,
        },
    ];
    (phases, times)
}

/// What one algorithm did with the traffic.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub(crate) algorithm: Algorithm,
    /// Per request, in order: admitted or not.
    pub(crate) admitted: Vec<bool>,
    /// Admitted in the window ending at each sample time (`STEP_MS` apart).
    pub(crate) curve: Vec<u64>,
}

/// Replays `times` through `algorithm`, one client, explicit times.
pub(crate) async fn replay(algorithm: Algorithm, times: &[u64]) -> Outcome {
    let limiter = Limiter::new(MemoryBackend::default());
    let policy = Policy::builder(algorithm.name(), algorithm)
        .limit(LIMIT)
        .window(Duration::from_millis(WINDOW_MS))
        .build()
        .expect("a valid policy");
    let mut admitted = Vec::with_capacity(times.len());
    for at in times {
        let now = Timestamp::from_millis(T0_MS + at);
        let decision = limiter
            .check(&PolicySet::from(policy.clone()), "client")
            .at(now)
            .await
            .map(|d| d[0].clone())
            .expect("the memory backend decides");
        admitted.push(decision.allowed);
    }
    let end = times.last().copied().unwrap_or(0) + WINDOW_MS;
    let curve = (0..=end / STEP_MS)
        .map(|sample| in_window(times, &admitted, sample * STEP_MS))
        .collect();
    Outcome {
        algorithm,
        admitted,
        curve,
    }
}

/// Admitted requests in the window `(end - WINDOW_MS, end]`.
fn in_window(times: &[u64], admitted: &[bool], end: u64) -> u64 {
    times
        .iter()
        .zip(admitted)
        .filter(|(t, ok)| **ok && **t <= end && **t + WINDOW_MS > end)
        .count() as u64
}

/// The most admitted in any span of one window whose requests all lie in `phase`: the worst
/// window span, found from every admitted request as the span's first.
pub(crate) fn worst_span(times: &[u64], admitted: &[bool], phase: &Range<u64>) -> u64 {
    let inside: Vec<u64> = times
        .iter()
        .zip(admitted)
        .filter(|(t, ok)| **ok && phase.contains(t))
        .map(|(t, _)| *t)
        .collect();
    inside
        .iter()
        .enumerate()
        .map(|(i, first)| {
            inside[i..]
                .iter()
                .take_while(|t| **t < first + WINDOW_MS)
                .count() as u64
        })
        .max()
        .unwrap_or(0)
}

/// One row of the table.
#[derive(Debug, Clone)]
pub(crate) struct Summary {
    pub(crate) algorithm: Algorithm,
    /// Per phase, the worst window span.
    pub(crate) worst: Vec<u64>,
    /// Requests decided otherwise than by the sliding log, as a share of all requests.
    pub(crate) differs: f64,
    /// Mean over the samples of |admitted per window − the sliding log's| / limit.
    pub(crate) rate_error: f64,
    pub(crate) admitted: usize,
}

/// Sums up `outcome` against `exact`, the sliding log's.
pub(crate) fn summarize(
    outcome: &Outcome,
    exact: &Outcome,
    times: &[u64],
    phases: &[Phase],
) -> Summary {
    let differs = outcome
        .admitted
        .iter()
        .zip(&exact.admitted)
        .filter(|(a, b)| a != b)
        .count();
    let error: u64 = outcome
        .curve
        .iter()
        .zip(&exact.curve)
        .map(|(a, b)| a.abs_diff(*b))
        .sum();
    #[allow(clippy::cast_precision_loss)]
    Summary {
        algorithm: outcome.algorithm,
        worst: phases
            .iter()
            .map(|phase| worst_span(times, &outcome.admitted, &phase.span))
            .collect(),
        differs: differs as f64 / times.len() as f64,
        rate_error: error as f64 / (outcome.curve.len() as f64 * LIMIT as f64),
        admitted: outcome.admitted.iter().filter(|ok| **ok).count(),
    }
}

/// Runs every algorithm; the outcomes (the sliding log's among them) and their summaries.
pub(crate) async fn run() -> (Vec<Phase>, Vec<Outcome>, Vec<Summary>) {
    let (phases, times) = traffic();
    let mut outcomes = Vec::new();
    for algorithm in Algorithm::ALL {
        outcomes.push(replay(algorithm, &times).await);
    }
    let exact = outcomes
        .iter()
        .find(|o| o.algorithm == Algorithm::SlidingWindowLog)
        .cloned()
        .expect("the sliding log is an algorithm");
    let summaries = outcomes
        .iter()
        .map(|o| summarize(o, &exact, &times, &phases))
        .collect();
    (phases, outcomes, summaries)
}

/// Prints the table and a JSON line per algorithm.
pub(crate) fn print(phases: &[Phase], summaries: &[Summary], requests: usize) {
    println!(
        "\naccuracy: one client, limit {LIMIT} per {} s, {requests} requests at explicit times",
        WINDOW_MS / 1000
    );
    println!(
        "worst admitted in any {} s span, per phase:",
        WINDOW_MS / 1000
    );
    for (i, phase) in phases.iter().enumerate() {
        println!("  [{}] {}", i + 1, phase.name);
    }
    println!(
        "{:<24} {:>5} {:>5} {:>5} {:>9} {:>18} {:>16}",
        "algorithm", "[1]", "[2]", "[3]", "admitted", "differs from log", "mean rate error"
    );
    for s in summaries {
        println!(
            "{:<24} {:>5} {:>5} {:>5} {:>9} {:>17.1}% {:>15.1}%",
            s.algorithm.name(),
            s.worst[0],
            s.worst[1],
            s.worst[2],
            s.admitted,
            s.differs * 100.0,
            s.rate_error * 100.0
        );
    }
    for s in summaries {
        println!(
            "{{\"mode\":\"accuracy\",\"contender\":\"{}\",\"worst_steady\":{},\"worst_boundary_burst\":{},\"worst_mix\":{},\"admitted\":{},\"differs_from_log\":{:.4},\"mean_rate_error\":{:.4}}}",
            s.algorithm.name(),
            s.worst[0],
            s.worst[1],
            s.worst[2],
            s.admitted,
            s.differs,
            s.rate_error
        );
    }
}

/// The sample times of a curve, in seconds from the start.
pub(crate) fn sample_seconds(sample: usize) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let ms = (sample as u64 * STEP_MS) as f64;
    ms / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_fixed_window_admits_twice_the_limit_across_an_edge_and_the_log_exactly_it() {
        let (phases, _, summaries) = run().await;
        let burst = phases
            .iter()
            .position(|p| p.name.contains("edge"))
            .expect("the boundary burst");
        let worst = |algorithm| {
            summaries
                .iter()
                .find(|s| s.algorithm == algorithm)
                .expect("every algorithm")
                .worst[burst]
        };
        assert_eq!(worst(Algorithm::FixedWindow), 2 * LIMIT);
        assert_eq!(worst(Algorithm::SlidingWindowLog), LIMIT);
        for s in &summaries {
            assert!(s.worst.iter().all(|w| *w <= 2 * LIMIT), "{:?}", s.algorithm);
        }
        let log = summaries
            .iter()
            .find(|s| s.algorithm == Algorithm::SlidingWindowLog)
            .expect("the log");
        assert_eq!((log.differs, log.rate_error), (0.0, 0.0));
        assert!(log.worst.iter().all(|w| *w <= LIMIT));
    }

    #[test]
    fn the_worst_span_counts_requests_less_than_a_window_apart() {
        let times = [0, 1, 2, 9_999, 10_000];
        let all = [true; 5];
        assert_eq!(worst_span(&times, &all, &(0..20_000)), 4);
        let second_denied = [true, false, true, true, true];
        assert_eq!(worst_span(&times, &second_denied, &(0..20_000)), 3);
        assert_eq!(worst_span(&times, &all, &(10_000..20_000)), 1);
    }
}
