//! A gRPC client sees RESOURCE_EXHAUSTED past the limit of its key, on real Redis.

use redlimit::Limiter;
use redlimit_tests::RedisServer;
use tokio::net::TcpListener;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_limit_sees_resource_exhausted() {
    let server = RedisServer::start();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let layer = tonic_demo::layer(Limiter::new(server.backend()), 3).expect("layer");
    tokio::spawn(tonic_demo::serve(listener, layer));
    let mut client = tonic_demo::connect(address).await.expect("connect");

    for call in 0..3 {
        let reply = tonic_demo::say_hello(&mut client, "key-a", "a").await;
        assert_eq!(reply.expect("within the limit"), "hello, a", "call {call}");
    }
    let status = tonic_demo::say_hello(&mut client, "key-a", "a")
        .await
        .expect_err("over the limit");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("per-api-key"), "{status:?}");
    // The limit is per key: another key still passes.
    assert!(
        tonic_demo::say_hello(&mut client, "key-b", "b")
            .await
            .is_ok()
    );
}
