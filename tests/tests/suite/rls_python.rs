//! The rate limit service asked by a client this project did not generate: Python, with stubs
//! built by grpcio-tools from Envoy's own .proto files (those envoy-types ships), on a real
//! Redis; envoyproxy/ratelimit's documented answers.

use std::{path::PathBuf, process::Command, sync::OnceLock, time::Duration};

use redlimit::{FailurePolicy, Limiter};
use redlimit_rls::{RlsConfig, RlsService};
use redlimit_tests::RedisServer;

use crate::rls::{EDGE, MESSAGING, listen};

/// The folder of the Python scripts.
fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python")
}

/// Where the stubs are, built once per run.
fn stubs() -> &'static PathBuf {
    static STUBS: OnceLock<PathBuf> = OnceLock::new();
    STUBS.get_or_init(|| {
        let ready = Command::new("python3")
            .args(["-c", "import grpc, grpc_tools"])
            .status();
        assert!(
            ready.is_ok_and(|s| s.success()),
            "python3 with grpcio and grpcio-tools is needed: python3 -m pip install grpcio grpcio-tools"
        );
        // Under the target folder, which cargo keeps for tests' files: nothing left in /tmp.
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("envoy-stubs");
        let built = Command::new("python3")
            .arg(scripts().join("envoy_stubs.py"))
            .arg(envoy_protos())
            .arg(&out)
            .status()
            .expect("python3 runs");
        assert!(built.success(), "building the stubs failed");
        out
    })
}

/// envoy-types' proto folder, where `cargo metadata` says its package is.
fn envoy_protos() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata's JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let envoy = packages
        .iter()
        .find(|p| p["name"] == "envoy-types")
        .expect("envoy-types is a dependency");
    let manifest = PathBuf::from(envoy["manifest_path"].as_str().expect("a path"));
    manifest.parent().expect("its folder").join("proto")
}

/// Asks the service at `address` once: the overall code, then each status as `CODE remaining
/// requests_per_unit`.
fn ask(address: std::net::SocketAddr, domain: &str, descriptors: &[&str]) -> Vec<String> {
    let output = Command::new("python3")
        .arg(scripts().join("rls_client.py"))
        .arg(stubs())
        .arg(address.to_string())
        .arg(domain)
        .args(descriptors)
        .output()
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the Python client failed: {stderr}"
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_of_envoys_protos_gets_envoyproxy_ratelimits_answers() {
    let server = RedisServer::start();
    let config = RlsConfig::from_files([("edge.yaml", EDGE), ("messaging.yaml", MESSAGING)])
        .expect("valid configuration");
    let limiter = Limiter::with_prefix(server.backend(), "py").expect("prefix");
    let rls = RlsService::new(
        limiter,
        config,
        FailurePolicy::Closed,
        Duration::from_secs(10),
    );
    let address = listen(rls);
    let asked = |domain: &'static str, descriptors: &'static [&'static str]| {
        tokio::task::spawn_blocking(move || ask(address, domain, descriptors))
    };
    // Marketing to one number, 2 a day, inside any message to it, 3 a day: the third marketing
    // message is over, and takes nothing from the per-number limit.
    let both: &[&str] = &["message_type=marketing,to_number=123", "to_number=123"];
    for _ in 0..2 {
        let answer = asked("messaging", both).await.expect("asked");
        assert_eq!(answer[0], "OK", "{answer:?}");
    }
    let third = asked("messaging", both).await.expect("asked");
    assert_eq!(third, ["OVER_LIMIT", "OVER_LIMIT 0 2", "OK 1 3"]);
    // Unlimited; shadow mode over its limit of 1, still OK; an unmatched descriptor.
    let free = asked("messaging", &["free=x"]).await.expect("asked");
    assert_eq!(free, ["OK", "OK 4294967295 -1"]);
    for _ in 0..2 {
        let shadow = asked("messaging", &["shadowed=x"]).await.expect("asked");
        assert_eq!(shadow[0], "OK");
    }
    let none = asked("messaging", &["nothing=x"]).await.expect("asked");
    assert_eq!(none, ["OK", "OK 0 -1"]);
    // A check of hits_addend 0 consumes nothing; negative hits give back, never past the limit.
    let peek = asked("messaging", &["hits:0:refunds=py"])
        .await
        .expect("asked");
    assert_eq!(peek, ["OK", "OK 3 3"]);
    let taken = asked("messaging", &["hits:3:refunds=py"])
        .await
        .expect("asked");
    assert_eq!(taken, ["OK", "OK 0 3"]);
    let over = asked("messaging", &["refunds=py"]).await.expect("asked");
    assert_eq!(over, ["OVER_LIMIT", "OVER_LIMIT 0 3"]);
    let refund = asked("messaging", &["neg:5:refunds=py"])
        .await
        .expect("asked");
    assert_eq!(refund, ["OK", "OK 3 3"]);
}
