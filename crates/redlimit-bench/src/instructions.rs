//! Instructions per decision: the saturation mode's contenders, driven by the same clients,
//! against a redis-server run under callgrind (valgrind), which counts every instruction the
//! server process executes while a contender's checks run: parsing, scripts, replies. CPU time
//! on a shared machine moved by a third between runs here, a count by at most 8%, so a change's
//! effect on Redis shows before a noisy saturation run can show it. Uniform keys; each
//! contender warmed up first (its scripts loaded, its clients' state written), then counted.

use std::{fs, path::PathBuf, process::Command, sync::Arc};

use deadpool_redis::redis;
use redlimit_tests::{RedisServer, script_calls};

use crate::{
    Settings,
    decisions::{NAIVE, NAIVE_SCRIPT, admin},
    report::Row,
    saturation::{Keys, contenders, drive},
};

/// The programs, from Debian's `valgrind` package.
const VALGRIND: &str = "valgrind";
const CALLGRIND_CONTROL: &str = "callgrind_control";

/// Whether valgrind's callgrind can be run.
pub(crate) fn available() -> bool {
    [VALGRIND, CALLGRIND_CONTROL].iter().all(|program| {
        Command::new(program)
            .arg("--version")
            .output()
            .is_ok_and(|out| out.status.success())
    })
}

/// The server under callgrind, counting nothing until told, and where it writes its counts.
struct Counted {
    server: RedisServer,
    dir: PathBuf,
}

impl Counted {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("redlimit-callgrind-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("a directory for callgrind's counts");
        let out = format!("--callgrind-out-file={}", dir.join("counts").display());
        let server = RedisServer::try_start_under(
            &[VALGRIND, "--tool=callgrind", "--instr-atstart=no", &out],
            // Its once-a-second chores only, so they weigh on no contender's count.
            &["--hz", "1"],
        )
        .unwrap_or_else(|message| panic!("{message}"));
        Self { server, dir }
    }

    fn control(&self, args: &[&str]) {
        let status = Command::new(CALLGRIND_CONTROL)
            .args(args)
            .arg(self.server.pid().to_string())
            .output()
            .expect("callgrind_control runs");
        assert!(status.status.success(), "callgrind_control {args:?} failed");
    }

    /// The instructions counted since the last count: callgrind writes them out as a new part
    /// (`counts.N`) and starts again from zero.
    fn count(&self) -> u64 {
        self.control(&["--dump"]);
        let newest = fs::read_dir(&self.dir)
            .expect("callgrind's directory")
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let part: u32 = name.strip_prefix("counts.")?.parse().ok()?;
                Some((part, entry.path()))
            })
            .max()
            .expect("a part written by the dump")
            .1;
        let text = fs::read_to_string(newest).expect("a readable part");
        // Its `totals:` line; `summary:` counts only what ran with instrumentation on from the
        // part's start, 0 here.
        text.lines()
            .find_map(|line| {
                line.strip_prefix("totals:")?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .expect("a part with its totals")
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Each contender's row: `decisions` checks counted after five per client to warm up, so that
/// nearly every client's state exists (a first write costs more than the steady state's).
/// Counted over 40,000 decisions, rows moved up to 8% between runs here (the naive script's with
/// how many of its calls Redis reads at once; a fixed window's with whether a minute boundary,
/// every client's new window, falls inside the count).
pub(crate) fn run(settings: &Settings, keys: &Keys) -> Vec<Row> {
    let counted = Counted::start();
    let url = counted.server.url();
    let mut admin = admin(&url);
    let naive_sha1: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(NAIVE_SCRIPT)
        .query(&mut admin)
        .expect("SCRIPT LOAD");
    let clients: Arc<[String]> = (0..settings.keys).map(|k| format!("client-{k}")).collect();
    let decisions = settings.decisions.max(1);
    let mut rows = Vec::new();
    for (name, contender) in contenders(&url, &naive_sha1)
        .into_iter()
        .filter(|(name, _)| settings.keeps(name))
    {
        drive(&contender, keys, &clients, 5 * settings.keys);
        let before = script_calls(&mut admin);
        counted.control(&["--instr=on"]);
        let (latencies, elapsed) = drive(&contender, keys, &clients, decisions);
        counted.control(&["--instr=off"]);
        let instructions = counted.count();
        let calls = script_calls(&mut admin).commands - before.commands;
        let count = latencies.len() as f64;
        rows.push(Row {
            mode: "instructions",
            contender: name,
            decisions_per_sec: count / elapsed.as_secs_f64(),
            p50_us: 0,
            p99_us: 0,
            commands_per_decision: Some(calls as f64 / count),
            redis_us_per_decision: None,
            bytes_per_key: None,
            extra: vec![("instructions_per_decision", instructions / decisions as u64)],
        });
    }
    rows
}

/// Prints the rows with each one's ratio to the naive script's count, then their JSON lines.
pub(crate) fn print(rows: &[Row], keys: &str) {
    let per_decision = |row: &Row| {
        row.extra
            .iter()
            .find(|(name, _)| *name == "instructions_per_decision")
            .map_or(0, |(_, value)| *value)
    };
    let naive = rows
        .iter()
        .find(|row| row.contender == NAIVE)
        .map_or(f64::NAN, |row| per_decision(row) as f64);
    println!(
        "\ninstructions (redis-server under callgrind: its instructions per decision, {keys} keys)"
    );
    println!(
        "{:<24} {:>14} {:>10} {:>10}",
        "contender", "instructions", "× naive", "cmds/dec"
    );
    for row in rows {
        println!(
            "{:<24} {:>14} {:>10.2} {:>10.4}",
            row.contender,
            per_decision(row),
            per_decision(row) as f64 / naive,
            row.commands_per_decision.unwrap_or(0.0),
        );
    }
    crate::saturation::print_sums(rows, "instructions", |row| Some(per_decision(row) as f64));
    for row in rows {
        println!("{}", row.json());
    }
}
