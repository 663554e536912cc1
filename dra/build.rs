//! Generates the gRPC code of the kubelet APIs (proto/) with protox, a protobuf compiler in
//! pure Rust, so building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/pluginregistration/v1/api.proto",
        "proto/dra/v1/api.proto",
        "proto/dra/v1beta1/api.proto",
        "proto/dra-health/v1alpha1/api.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
