//! TLS end to end, as an operator sets it up: `axle-hub --tls-cert --tls-key` (a
//! certificate of the company's CA, made here by rcgen) serves HTTPS, and gRPC with a
//! certificate from the hub's own spoke CA. A platform admin mints a join token with
//! `axle cluster join-token`; `axle-spoke --join-token` joins over TLS (checking the hub
//! against the CA hash in the token), keeps its certificate in its data dir (0600) and
//! connects with mTLS from then on, also after a restart without the token. A workload
//! is submitted, runs on the spoke and its log is read; `axle cluster revoke` cuts the
//! spoke off. A CLI without the CA is refused with a clear error, and a hub started with
//! no TLS flags at all serves TLS from its own CA, never plaintext.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axle_e2e::{Ports, bin};

/// Kills the process when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A CA, and a certificate for 127.0.0.1 signed by it: (CA PEM, cert PEM, key PEM).
fn certificates() -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "company CA");
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = p.signed_by(&key, &issuer).unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

fn axle(hub: &str, ca: Option<&Path>, args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(bin("axle"));
    if let Some(ca) = ca {
        cmd.arg("--ca-file").arg(ca);
    }
    cmd.args(args)
        .env("AXLE_HUB", hub)
        .env_remove("AXLE_CA_FILE")
        .env_remove("AXLE_TEAM")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    let out = cmd.output().expect("run axle");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `axle-spoke` for eu-1 against `grpc`, with `extra` flags, logging to `log`.
fn spoke(grpc: u16, data: &Path, log: &Path, extra: &[&str]) -> Killed {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Killed(
        Command::new(bin("axle-spoke"))
            .args(["--hub", &format!("https://127.0.0.1:{grpc}")])
            .args(["--cluster", "eu-1", "--region", "eu-west"])
            .args(["--gpus", "8xH100:80GB"])
            .arg("--data-dir")
            .arg(data)
            .args(extra)
            .env_remove("AXLE_SPOKE_TOKEN")
            .env_remove("AXLE_CA_FILE")
            .env_remove("AXLE_JOIN_TOKEN")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start axle-spoke"),
    )
}

/// Waits until `axle get clusters` shows eu-1 in `state`.
async fn wait_cluster(hub: &str, ca: &Path, token: &str, state: &str) -> bool {
    for _ in 0..300 {
        let (code, out, _) = axle(hub, Some(ca), &["--token", token, "get", "clusters"]);
        if code == 0
            && out
                .lines()
                .any(|l| l.starts_with("eu-1") && l.contains(state))
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spoke_joins_runs_work_over_mtls_and_is_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates();
    let file = |name: &str, pem: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, pem).unwrap();
        p
    };
    let (ca, cert, key) = (
        file("ca.pem", &ca),
        file("hub.pem", &cert),
        file("hub-key.pem", &key),
    );
    let policy = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples/policy");
    let data = dir.path().join("hub");
    // The first platform admin's token, written into the stopped hub's store.
    let out = Command::new(bin("axle-hub"))
        .args(["create-token", "--user", "platform-admin"])
        .arg("--data-dir")
        .arg(&data)
        .env_remove("AXLE_STORE")
        .output()
        .expect("axle-hub create-token");
    assert!(out.status.success(), "{out:?}");
    let admin = String::from_utf8_lossy(&out.stdout).trim().to_string();

    let ports = Ports::free();
    let log = std::fs::File::create(dir.path().join("hub.log")).unwrap();
    let _hub = Killed(
        Command::new(bin("axle-hub"))
            .args(["--policy", policy])
            .arg("--data-dir")
            .arg(&data)
            .args(["--http", &format!("127.0.0.1:{}", ports.http)])
            .args(["--grpc", &format!("127.0.0.1:{}", ports.grpc)])
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .env_remove("AXLE_SPOKE_TOKEN")
            .env_remove("AXLE_STORE")
            .env_remove("AXLE_AUTH")
            .env_remove("AXLE_INSECURE_NO_TLS")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start axle-hub"),
    );
    let hub = format!("https://127.0.0.1:{}", ports.http);
    let logs_of = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();

    // A spoke without a join token or a certificate does not start, and says what to do.
    let spoke_data = dir.path().join("spoke");
    let out = Command::new(bin("axle-spoke"))
        .args(["--hub", &format!("https://127.0.0.1:{}", ports.grpc)])
        .args(["--cluster", "eu-1", "--gpus", "8xH100:80GB"])
        .arg("--data-dir")
        .arg(&spoke_data)
        .env_remove("AXLE_CA_FILE")
        .env_remove("AXLE_JOIN_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--join-token") && err.contains("axle cluster join-token eu-1"),
        "{err}"
    );

    let mut join = (0, String::new(), String::new());
    for _ in 0..200 {
        join = axle(
            &hub,
            Some(&ca),
            &[
                "--token",
                &admin,
                "cluster",
                "join-token",
                "eu-1",
                "--ttl",
                "10m",
            ],
        );
        if join.0 == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(join.0, 0, "{join:?}\nhub:\n{}", logs_of("hub.log"));
    let token = join.1.trim().to_string();
    assert!(token.starts_with("axlej_"), "{token}");

    let spoke_log = dir.path().join("spoke.log");
    let mut running = spoke(
        ports.grpc,
        &spoke_data,
        &spoke_log,
        &["--join-token", &token],
    );
    assert!(
        wait_cluster(&hub, &ca, &admin, "Ready").await,
        "the spoke never registered over mTLS\nhub:\n{}\nspoke:\n{}",
        logs_of("hub.log"),
        logs_of("spoke.log")
    );
    let identity = spoke_data.join("identity").join("identity.json");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&identity).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", identity.display());

    let (code, out, err) = axle(
        &hub,
        Some(&ca),
        &[
            "--token",
            &admin,
            "submit",
            "--team",
            "nlp",
            "--gpus",
            "1",
            "--wait",
            "--",
            "echo",
            "over mtls",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let id = out
        .split(|c: char| !c.is_ascii_digit())
        .find(|s| !s.is_empty())
        .expect("an id")
        .to_string();
    let (code, out, err) = axle(&hub, Some(&ca), &["--token", &admin, "logs", "-f", &id]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("over mtls"), "{out}");

    // Restarted without the token: it comes back with the certificate it keeps.
    drop(running);
    running = spoke(ports.grpc, &spoke_data, &spoke_log, &[]);
    assert!(
        wait_cluster(&hub, &ca, &admin, "Ready").await,
        "{}",
        logs_of("spoke.log")
    );

    // The token was spent: a second spoke with it (another data dir) is refused.
    let out = Command::new(bin("axle-spoke"))
        .args(["--hub", &format!("https://127.0.0.1:{}", ports.grpc)])
        .args([
            "--cluster",
            "eu-1",
            "--gpus",
            "8xH100:80GB",
            "--join-token",
            &token,
        ])
        .arg("--data-dir")
        .arg(dir.path().join("thief"))
        .env_remove("AXLE_CA_FILE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already used"), "{err}");

    // A token carrying another CA's hash: the spoke will not talk to this hub at all.
    let other_ca = format!("{}{}", &token[..84], "0".repeat(64));
    let out = Command::new(bin("axle-spoke"))
        .args(["--hub", &format!("https://127.0.0.1:{}", ports.grpc)])
        .args([
            "--cluster",
            "eu-1",
            "--gpus",
            "8xH100:80GB",
            "--join-token",
            &other_ca,
        ])
        .arg("--data-dir")
        .arg(dir.path().join("misled"))
        .env_remove("AXLE_CA_FILE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not chain to the CA the join token names"),
        "{err}"
    );

    // Revoked: the spoke is cut off and cannot come back.
    let (code, out, err) = axle(
        &hub,
        Some(&ca),
        &["--token", &admin, "cluster", "revoke", "eu-1"],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("revoked: 1 certificates"), "{out}");
    assert!(
        wait_cluster(&hub, &ca, &admin, "Disconnected").await,
        "{}",
        logs_of("spoke.log")
    );
    let mut refused = false;
    for _ in 0..100 {
        if logs_of("spoke.log").contains("was revoked") {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused, "{}", logs_of("spoke.log"));
    drop(running);

    // Without the CA the CLI refuses the hub's certificate, and says it is TLS.
    let (code, _, err) = axle(&hub, None, &["get", "clusters"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("certificate") && err.contains("--ca-file"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hub_without_tls_flags_serves_tls_from_its_own_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ports = Ports::free();
    let data = dir.path().join("hub");
    let log = std::fs::File::create(dir.path().join("hub.log")).unwrap();
    let _hub = Killed(
        Command::new(bin("axle-hub"))
            .args([
                "--policy",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples/policy"),
            ])
            .arg("--data-dir")
            .arg(&data)
            .args(["--http", &format!("127.0.0.1:{}", ports.http)])
            .args(["--grpc", &format!("127.0.0.1:{}", ports.grpc)])
            .env_remove("AXLE_SPOKE_TOKEN")
            .env_remove("AXLE_STORE")
            .env_remove("AXLE_TLS_CERT")
            .env_remove("AXLE_INSECURE_NO_TLS")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start axle-hub"),
    );
    let ca = data.join("spoke-ca.pem");
    let hub = format!("https://127.0.0.1:{}", ports.http);
    let mut answer = (0, String::new(), String::new());
    for _ in 0..200 {
        answer = axle(&hub, Some(&ca), &["get", "clusters"]);
        // 401: TLS worked, and the hub wants a token.
        if answer.2.contains("no credentials") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        answer.2.contains("no credentials"),
        "{answer:?}\n{}",
        std::fs::read_to_string(dir.path().join("hub.log")).unwrap_or_default()
    );
    // Plaintext HTTP to the same port gets no HTTP answer.
    let (code, _, err) = axle(
        &format!("http://127.0.0.1:{}", ports.http),
        None,
        &["get", "clusters"],
    );
    assert_ne!(code, 0, "{err}");
    assert!(!err.contains("no credentials"), "{err}");
}
