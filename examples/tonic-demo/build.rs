//! Generates the Greeter service's server and client from a definition in Rust: no `protoc`.

fn main() {
    let say_hello = tonic_build::manual::Method::builder()
        .name("say_hello")
        .route_name("SayHello")
        .input_type("crate::HelloRequest")
        .output_type("crate::HelloReply")
        .codec_path("tonic_prost::ProstCodec")
        .build();
    let greeter = tonic_build::manual::Service::builder()
        .name("Greeter")
        .package("demo")
        .method(say_hello)
        .build();
    tonic_build::manual::Builder::new().compile(&[greeter]);
}
