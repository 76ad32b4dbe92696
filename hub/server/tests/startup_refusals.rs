//! The hub refuses to start where it would trust anyone: spokes without a token on an
//! address other machines reach, plaintext `--dev` on such an address. It says why and
//! binds nothing.

#[test]
fn dev_serves_plaintext_on_loopback_only() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_axle-hub"))
        .args(["--dev", "--grpc", "0.0.0.0:0", "--http", "127.0.0.1:0"])
        .env_remove("AXLE_SPOKE_TOKEN")
        .env_remove("AXLE_STORE")
        .env_remove("AXLE_INSECURE_NO_TLS")
        .output()
        .expect("run axle-hub");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--dev serves plaintext on loopback only") && err.contains("--tls-cert"),
        "{err}"
    );
}

#[test]
fn spokes_without_a_token_are_taken_on_loopback_only() {
    // Observed: without --spoke-token the hub accepted tokenless spokes on any address.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_axle-hub"))
        .args(["--dev", "--insecure-no-tls", "--grpc", "0.0.0.0:0"])
        .args(["--http", "127.0.0.1:0"])
        .env_remove("AXLE_SPOKE_TOKEN")
        .env_remove("AXLE_STORE")
        .output()
        .expect("run axle-hub");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--grpc 0.0.0.0:0 is not a loopback address") && err.contains("--spoke-token"),
        "{err}"
    );
}

#[test]
fn no_authentication_is_taken_on_loopback_only() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_axle-hub"))
        .args([
            "--dev",
            "--auth",
            "none",
            "--http",
            "0.0.0.0:0",
            "--grpc",
            "127.0.0.1:0",
        ])
        .args(["--spoke-token", "t", "--insecure-no-tls"])
        .env_remove("AXLE_STORE")
        .env_remove("AXLE_AUTH")
        .output()
        .expect("run axle-hub");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--auth none") && err.contains("loopback"),
        "{err}"
    );
}
