//! The harness itself: it starts real servers, explains a missing binary, shows the log of a
//! server that never became ready, and leaves no process behind.

use std::{net::TcpStream, path::Path};

use deadpool_redis::redis;
use redlimit_tests::RedisServer;

#[test]
fn a_started_server_answers_and_is_killed_and_reaped_on_drop() {
    let server = RedisServer::start();
    let mut connection = server.connection();
    let pong: String = redis::cmd("PING").query(&mut connection).expect("PING");
    assert_eq!(pong, "PONG");
    let save: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("save")
        .query(&mut connection)
        .expect("CONFIG");
    assert_eq!(save, ["save", ""], "persistence is off");
    let (pid, port) = (server.pid(), server.port());
    drop(connection);
    drop(server);
    // Reaped: not even a zombie remains in the process table.
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "process {pid} remains"
    );
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port {port} still open"
    );
}

#[test]
fn a_missing_redis_server_fails_with_how_to_install_it() {
    let err = RedisServer::try_start("redlimit-no-such-redis-server", &[]).expect_err("missing");
    assert!(err.contains("apt-get install redis-server"), "{err}");
    assert!(err.contains("redlimit-no-such-redis-server"), "{err}");
}

#[test]
fn a_server_that_never_becomes_ready_shows_its_log() {
    let err = RedisServer::try_start(
        &redlimit_tests::redis_server_binary(),
        &["--maxmemory", "lots"],
    )
    .expect_err("a bad setting stops the server");
    assert!(err.contains("never became ready"), "{err}");
    assert!(
        err.contains("maxmemory"),
        "the server's own words are shown: {err}"
    );
}
