//! Figures per contender: a table for people, a JSON line each for machines.

use std::{fmt::Write as _, time::Duration};

use redlimit_tests::Sent;

/// What one contender did, summed over the rounds.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    latencies_us: Vec<u32>,
    elapsed: Duration,
    sent: Sent,
}

impl Tally {
    pub(crate) fn add(&mut self, latencies_us: Vec<u32>, elapsed: Duration, sent: Sent) {
        self.latencies_us.extend(latencies_us);
        self.elapsed += elapsed;
        self.sent.commands += sent.commands;
        self.sent.usec += sent.usec;
    }

    /// The row of this tally; the Redis figures and `bytes_per_key` only where they mean
    /// something.
    pub(crate) fn row(
        mut self,
        mode: &'static str,
        contender: &str,
        counts_commands: bool,
        bytes_per_key: Option<f64>,
    ) -> Row {
        self.latencies_us.sort_unstable();
        let decisions = self.latencies_us.len();
        let percentile = |p: usize| {
            self.latencies_us
                .get((decisions * p / 100).min(decisions.saturating_sub(1)))
                .copied()
                .unwrap_or(0)
        };
        let count = decisions as f64;
        Row {
            mode,
            contender: contender.to_owned(),
            decisions_per_sec: count / self.elapsed.as_secs_f64().max(1e-9),
            p50_us: percentile(50),
            p99_us: percentile(99),
            commands_per_decision: counts_commands
                .then(|| self.sent.commands as f64 / count.max(1.0)),
            redis_us_per_decision: counts_commands.then(|| self.sent.usec as f64 / count.max(1.0)),
            bytes_per_key,
            extra: Vec::new(),
        }
    }
}

/// One contender's figures.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) mode: &'static str,
    pub(crate) contender: String,
    pub(crate) decisions_per_sec: f64,
    pub(crate) p50_us: u32,
    pub(crate) p99_us: u32,
    pub(crate) commands_per_decision: Option<f64>,
    /// Microseconds Redis spent executing what the contender sent, per decision.
    pub(crate) redis_us_per_decision: Option<f64>,
    pub(crate) bytes_per_key: Option<f64>,
    /// Mode-specific figures, such as the flood's admitted counts.
    pub(crate) extra: Vec<(&'static str, u64)>,
}

impl Row {
    pub(crate) fn json(&self) -> String {
        let number = |v: Option<f64>| v.map_or_else(|| "null".to_owned(), |v| format!("{v:.4}"));
        let mut line = format!(
            "{{\"mode\":\"{}\",\"contender\":\"{}\",\"decisions_per_sec\":{:.1},\"p50_us\":{},\"p99_us\":{},\"commands_per_decision\":{},\"redis_us_per_decision\":{},\"bytes_per_key\":{}",
            self.mode,
            self.contender,
            self.decisions_per_sec,
            self.p50_us,
            self.p99_us,
            number(self.commands_per_decision),
            number(self.redis_us_per_decision),
            number(self.bytes_per_key),
        );
        for (name, value) in &self.extra {
            let _ = write!(line, ",\"{name}\":{value}");
        }
        line.push('}');
        line
    }
}

/// Prints `rows` as a table with each one's ratios to `baseline` (decisions per second, and
/// Redis µs per decision), then their JSON lines.
pub(crate) fn print(title: &str, rows: &[Row], baseline: &str) {
    let base = rows.iter().find(|r| r.contender == baseline);
    let base_rate = base.map_or(f64::NAN, |r| r.decisions_per_sec);
    let base_redis_us = base.and_then(|r| r.redis_us_per_decision);
    println!("\n{title}");
    println!(
        "{:<24} {:>12} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "contender",
        "per second",
        "ratio",
        "p50 µs",
        "p99 µs",
        "cmds/dec",
        "redis µs",
        "× redis",
        "bytes/key"
    );
    for row in rows {
        let optional = |v: Option<f64>, digits: usize| {
            v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
        };
        let redis_ratio = row
            .redis_us_per_decision
            .zip(base_redis_us)
            .map(|(us, base)| us / base);
        println!(
            "{:<24} {:>12.0} {:>8.3} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10}",
            row.contender,
            row.decisions_per_sec,
            row.decisions_per_sec / base_rate,
            row.p50_us,
            row.p99_us,
            optional(row.commands_per_decision, 4),
            optional(row.redis_us_per_decision, 2),
            optional(redis_ratio, 2),
            optional(row.bytes_per_key, 0),
        );
    }
    for row in rows.iter().filter(|row| !row.extra.is_empty()) {
        let extra: Vec<String> = row
            .extra
            .iter()
            .map(|(name, value)| format!("{name} {value}"))
            .collect();
        println!("  {}: {}", row.contender, extra.join(", "));
    }
    for row in rows {
        println!("{}", row.json());
    }
}
