//! A gRPC Greeter limited per `x-api-key` metadata by redlimit.

use std::{net::SocketAddr, time::Duration};

use redlimit::{Algorithm, ConfigError, GuardedLimiter, Limiter, Policy};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};
use tower_redlimit::{HeaderKey, MissingKey, RateLimitLayer};

/// The request message.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HelloRequest {
    /// Who to greet.
    #[prost(string, tag = "1")]
    pub name: String,
}

/// The reply message.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HelloReply {
    /// The greeting.
    #[prost(string, tag = "1")]
    pub message: String,
}

#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    rust_2018_idioms,
    missing_debug_implementations
)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/demo.Greeter.rs"));
}

pub use generated::{greeter_client::GreeterClient, greeter_server};

/// Greets.
#[derive(Debug, Default, Clone, Copy)]
pub struct Greeter;

#[tonic::async_trait]
impl greeter_server::Greeter for Greeter {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        Ok(Response::new(HelloReply {
            message: format!("hello, {}", request.into_inner().name),
        }))
    }
}

/// The limit: `limit` calls per minute per `x-api-key`; calls without a key share one bucket.
///
/// # Errors
/// Never for a `limit` of 1 or more.
pub fn layer(limiter: Limiter, limit: u64) -> Result<RateLimitLayer, ConfigError> {
    let per_key = Policy::builder("per-api-key", Algorithm::Gcra)
        .limit(limit)
        .window(Duration::from_secs(60))
        .build()?;
    Ok(
        RateLimitLayer::new(GuardedLimiter::builder(limiter, per_key).build())
            .key(HeaderKey::new("x-api-key")?)
            .missing_key(MissingKey::Shared("anonymous".to_owned())),
    )
}

/// Serves the limited Greeter on `listener` until the task is dropped.
///
/// # Errors
/// A transport failure.
pub async fn serve(
    listener: TcpListener,
    layer: RateLimitLayer,
) -> Result<(), tonic::transport::Error> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tonic::transport::Server::builder()
        .layer(layer)
        .add_service(greeter_server::GreeterServer::new(Greeter))
        .serve_with_incoming(incoming)
        .await
}

/// Calls SayHello with `api_key` as metadata.
///
/// # Errors
/// The call's status, such as `RESOURCE_EXHAUSTED` once the key is over its limit.
pub async fn say_hello(
    client: &mut GreeterClient<tonic::transport::Channel>,
    api_key: &str,
    name: &str,
) -> Result<String, Status> {
    let mut request = Request::new(HelloRequest {
        name: name.to_owned(),
    });
    let key = api_key
        .parse()
        .map_err(|_| Status::invalid_argument("the api key is not valid metadata"))?;
    request.metadata_mut().insert("x-api-key", key);
    Ok(client.say_hello(request).await?.into_inner().message)
}

/// Connects a client to `address`.
///
/// # Errors
/// A transport failure.
pub async fn connect(
    address: SocketAddr,
) -> Result<GreeterClient<tonic::transport::Channel>, tonic::transport::Error> {
    GreeterClient::connect(format!("http://{address}")).await
}
