//! The guard's own path on a real Redis: what one check costs the block cache.

use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{Algorithm, GuardedLimiter, Limiter, Policy, Reason, RedisBackend};

/// A throwaway `redis-server` on a free loopback port, killed when dropped. Not the test
/// harness's: that crate depends on this one, so a unit test here cannot use it.
struct Server {
    child: Child,
    address: SocketAddr,
}

impl Server {
    fn start() -> Self {
        let address = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port");
        let binary = std::env::var("REDLIMIT_REDIS_SERVER").unwrap_or("redis-server".into());
        let child = Command::new(&binary)
            .args(["--bind", "127.0.0.1", "--port", &address.port().to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {binary} ({e}): install Redis (apt-get install redis-server)")
            });
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(address).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self { child, address }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_check_on_redis_hashes_the_client_at_most_once_and_only_while_a_block_is_held() {
    let server = Server::start();
    let redis = RedisBackend::builder(format!("redis://{}", server.address))
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid");
    let policy = Policy::builder("p", Algorithm::FixedWindow)
        .limit(1)
        .window(Duration::from_secs(600))
        .build()
        .expect("valid");
    let guard = GuardedLimiter::builder(Limiter::new(redis), policy)
        .budget(Duration::from_secs(5))
        .build();
    let counts = || guard.blocks().expect("on by default").counts.get();

    let allowed = guard.check("client").await;
    assert!(allowed.allowed() && allowed[0].reason == Reason::Redis);
    assert_eq!(
        counts(),
        (0, 0),
        "allowed while no block is held: no hash, no lookup"
    );

    let denied = guard.check("client").await;
    assert!(!denied.allowed() && denied[0].reason == Reason::Redis);
    assert_eq!(counts(), (1, 1), "denied: one hash, the record");

    let blocked = guard.check("client").await;
    assert_eq!(blocked[0].reason, Reason::LocalBlock);
    assert_eq!(counts(), (2, 2), "blocked: one hash, one lookup");

    // Another client, while a block is held: looked up, then recorded under the one hash.
    let other = guard.check("other").await;
    assert!(other.allowed());
    assert_eq!(counts(), (3, 3), "looked up once a block is held");
    let other = guard.check("other").await;
    assert!(!other.allowed() && other[0].reason == Reason::Redis);
    assert_eq!(
        counts(),
        (4, 5),
        "denied: one hash, the lookup and the record"
    );
}
