//! Starts the limited Greeter on 127.0.0.1 (in-memory backend), then calls it as a client until
//! the limit answers `RESOURCE_EXHAUSTED`.

use std::process::ExitCode;

use redlimit::{Limiter, MemoryBackend};
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> ExitCode {
    let listener = match TcpListener::bind("127.0.0.1:0").await {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!("tonic-demo: cannot listen: {err}");
            return ExitCode::FAILURE;
        }
    };
    let Ok(address) = listener.local_addr() else {
        return ExitCode::FAILURE;
    };
    let layer = match tonic_demo::layer(Limiter::new(MemoryBackend::default()), 3) {
        Ok(layer) => layer,
        Err(err) => {
            eprintln!("tonic-demo: {err}");
            return ExitCode::FAILURE;
        }
    };
    println!("tonic-demo: Greeter on {address}, 3 calls per minute per x-api-key (in-memory)");
    tokio::spawn(tonic_demo::serve(listener, layer));
    let mut client = match tonic_demo::connect(address).await {
        Ok(client) => client,
        Err(err) => {
            eprintln!("tonic-demo: cannot connect: {err}");
            return ExitCode::FAILURE;
        }
    };
    for call in 1..=5 {
        match tonic_demo::say_hello(&mut client, "demo-key", "redlimit").await {
            Ok(message) => println!("call {call}: OK {message:?}"),
            Err(status) => println!("call {call}: {:?} {:?}", status.code(), status.message()),
        }
    }
    ExitCode::SUCCESS
}
