//! TLS end to end, as an operator sets it up: `axle-hub --tls-cert --tls-key` (a
//! certificate of the company's CA, made here by rcgen), `axle-spoke --hub https://…
//! --ca-file`, and `axle --hub https://… --ca-file`: a workload is submitted, runs on the
//! spoke and its log is read, all over TLS; a CLI without the CA is refused with a clear
//! error.

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

#[tokio::test(flavor = "multi_thread")]
async fn a_workload_runs_and_is_read_over_tls_from_hub_to_spoke_to_cli() {
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
    let ports = Ports::free();
    let log = std::fs::File::create(dir.path().join("hub.log")).unwrap();
    let _hub = Killed(
        Command::new(bin("axle-hub"))
            .args(["--dev", "--auth", "none"])
            .args(["--http", &format!("127.0.0.1:{}", ports.http)])
            .args(["--grpc", &format!("127.0.0.1:{}", ports.grpc)])
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .env_remove("AXLE_SPOKE_TOKEN")
            .env_remove("AXLE_STORE")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start axle-hub"),
    );
    let spoke_log = std::fs::File::create(dir.path().join("spoke.log")).unwrap();
    let _spoke = Killed(
        Command::new(bin("axle-spoke"))
            .args(["--hub", &format!("https://127.0.0.1:{}", ports.grpc)])
            .args([
                "--cluster",
                "eu-1",
                "--region",
                "eu-west",
                "--gpus",
                "8xH100:80GB",
            ])
            .arg("--ca-file")
            .arg(&ca)
            .arg("--data-dir")
            .arg(dir.path().join("spoke"))
            .env_remove("AXLE_SPOKE_TOKEN")
            .env_remove("AXLE_CA_FILE")
            .stdout(Stdio::null())
            .stderr(spoke_log)
            .spawn()
            .expect("start axle-spoke"),
    );
    let hub = format!("https://127.0.0.1:{}", ports.http);
    let logs_of = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
    let mut ready = false;
    for _ in 0..200 {
        let (code, out, _) = axle(&hub, Some(&ca), &["get", "clusters"]);
        if code == 0
            && out
                .lines()
                .any(|l| l.starts_with("eu-1") && l.contains("Ready"))
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ready,
        "the spoke never registered over TLS\nhub:\n{}\nspoke:\n{}",
        logs_of("hub.log"),
        logs_of("spoke.log")
    );

    let (code, out, err) = axle(
        &hub,
        Some(&ca),
        &[
            "submit", "--team", "nlp", "--gpus", "1", "--wait", "--", "echo", "over tls",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let id = out
        .split(|c: char| !c.is_ascii_digit())
        .find(|s| !s.is_empty())
        .expect("an id")
        .to_string();
    let (code, out, err) = axle(&hub, Some(&ca), &["logs", "-f", &id]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("over tls"), "{out}");

    // Without the CA the CLI refuses the hub's certificate, and says it is TLS.
    let (code, _, err) = axle(&hub, None, &["get", "clusters"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("certificate") && err.contains("--ca-file"),
        "{err}"
    );
}
