//! Compiles `axle/v1/axle.proto` with protox (pure Rust, no system protoc).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=axle/v1/axle.proto");
    let fds = protox::compile(["axle/v1/axle.proto"], ["."])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
