//! `redlimit`: an operator's tool against the Redis an application's limits live in. It reads
//! and resets clients' state, lists the busiest clients, and suggests limits from live traffic;
//! see `redlimit --help`.

use std::process::ExitCode;

mod args;
mod commands;
mod distribution;
mod other_numbers;

use self::{
    args::Args,
    commands::{USAGE, run},
};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return if args.is_empty() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        };
    }
    let parsed = match Args::parse(&args) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("redlimit: {message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&parsed).await {
        Ok(output) => {
            print!("{output}");
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("redlimit: {}", failure.message);
            ExitCode::from(failure.status)
        }
    }
}
